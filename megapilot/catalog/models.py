"""Model presets (`data/models.yaml`) and resolution of whatever a user passes as `--model`.

`get_model` accepts a preset name (case-insensitive; `-`, `_`, `.` and spaces are ignored, so
`Llama-3.1-8B`, `llama3_1_8b` and `llama3.1-8b` are one name), a path to a Hugging Face
`config.json` or a directory holding one, or a JSON/YAML file of ModelSpec fields.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from megapilot.catalog.hf import from_hf_config, load_hf_config, looks_like_hf_config
from megapilot.catalog.hub import looks_like_hub_id, resolve_hub_config
from megapilot.errors import MegapilotError, from_validation_error
from megapilot.spec.model import ModelSpec
from megapilot.spec.plan_file import looks_like_saved_plan

_PRESET_FILE = "models.yaml"
_SPEC_FILE_SUFFIXES = (".json", ".yaml", ".yml")


@dataclass(frozen=True)
class ModelPreset:
    """One catalog entry: the spec, where its numbers come from, and the size its publisher states."""

    spec: ModelSpec
    source: str
    aliases: tuple[str, ...] = ()
    published_params_b: float | None = None
    lookup_keys: tuple[str, ...] = field(default=(), repr=False)
    # Parameters the published size counts that the spec does not build (Llama 4's vision encoder and projector):
    # added to the spec's count before the two are compared, so that like is compared with like.
    published_extra_params: int = 0
    # The active size its publisher states, and whether that figure counts the input embedding (publishers
    # differ: Llama 4's 17B does, GPT-OSS's, DeepSeek's and Kimi's do not).
    published_active_params_b: float | None = None
    published_active_counts_input_embedding: bool = True


def lookup_key(name: str) -> str:
    """The form names are compared in: lowercase, without `-`, `_`, `.` or spaces."""
    return "".join(ch for ch in name.lower() if ch not in "-_. ")


@lru_cache(maxsize=1)
def load_presets() -> dict[str, ModelPreset]:
    """All presets by canonical name, in catalog order."""
    # start-up: yaml costs 18 ms to import, paid only where YAML is read
    import yaml

    text = resources.files("megapilot.catalog").joinpath("data").joinpath(_PRESET_FILE).read_text(encoding="utf-8")
    presets: dict[str, ModelPreset] = {}
    for entry in yaml.safe_load(text):
        preset = _preset_from_entry(dict(entry))
        presets[preset.spec.name] = preset
    return presets


def _preset_from_entry(entry: dict[str, Any]) -> ModelPreset:
    source = str(entry.pop("source"))
    aliases = tuple(entry.pop("aliases", ()) or ())
    published = entry.pop("published_params_b", None)
    extra = int(entry.pop("published_extra_params", 0))
    active = entry.pop("published_active_params_b", None)
    active_with_embedding = not entry.pop("published_active_without_input_embedding", False)
    spec = ModelSpec(**entry)
    keys = tuple(lookup_key(n) for n in (spec.name, *aliases))
    return ModelPreset(spec, source, aliases, published, keys, extra, active, active_with_embedding)


@lru_cache(maxsize=1)
def _presets_by_key() -> dict[str, ModelPreset]:
    return {key: preset for preset in load_presets().values() for key in preset.lookup_keys}


def list_models() -> list[ModelSpec]:
    """Every preset's ModelSpec, in catalog order."""
    return [preset.spec for preset in load_presets().values()]


def get_preset(name: str) -> ModelPreset | None:
    """The preset called `name` (or one of its aliases), None when there is none."""
    return _presets_by_key().get(lookup_key(name))


@dataclass(frozen=True)
class ResolvedModel:
    """What `--model X` became, and where it came from: `preset` (an alias said aloud), `file`, `hub` (the
    Hugging Face cache or a download) or `preset for hub id` (offline: the preset read from that repository's
    config.json stands in)."""

    spec: ModelSpec
    requested: str
    source: str

    def describe(self) -> str:
        """`llama3.1-70b (preset; 'llama3-70b' is its alias)`."""
        said = self.requested.strip()
        alias = f"; '{said}' is its alias" if self.source == "preset" and lookup_key(said) != lookup_key(
            self.spec.name) else ""
        origin = "" if self.source in ("preset", "file") or said == self.spec.name else f" {said}"
        return f"{self.spec.name} ({self.source}{origin}{alias})"

    def to_dict(self) -> dict[str, str]:
        return {"name": self.spec.name, "requested": self.requested, "source": self.source}


def resolve_model(name_or_path: str | Path) -> ResolvedModel:
    """`get_model`, saying where the model came from."""
    text = str(name_or_path).strip()
    preset = None if not text or "/" in text or "\\" in text else get_preset(text)
    if preset is not None:
        return ResolvedModel(preset.spec, text, "preset")
    path = Path(text).expanduser() if text else None
    if path is not None and (path.is_dir() or path.is_file()):
        return ResolvedModel(get_model(text), text, "file")
    spec = get_model(text)
    if looks_like_hub_id(text):
        stand_in = preset_of_hub_repo(text)
        source = "preset for hub id" if stand_in is not None and spec == stand_in.spec else "hub"
        return ResolvedModel(spec, text, source)
    return ResolvedModel(spec, text, "file")


def get_model(name_or_path: str | Path) -> ModelSpec:
    """Resolve a preset name, a HF config.json (file or directory) or a ModelSpec JSON/YAML file."""
    text = str(name_or_path).strip()
    if not text:
        raise MegapilotError("no model given", field="model", fix="pass a preset name (see `megapilot models`)")
    preset = None if "/" in text or "\\" in text else get_preset(text)
    if preset is not None:  # a bare name is a preset even if a folder of that name exists here
        return preset.spec
    path = Path(text).expanduser()
    if path.is_dir():
        return load_hf_config(path)
    if path.is_file():
        return _load_model_file(path)
    if looks_like_hub_id(text):  # a path that exists wins, as with huggingface_hub's own from_pretrained
        return _hub_model(text)
    if path.suffix.lower() in _SPEC_FILE_SUFFIXES or "/" in text:
        raise MegapilotError(
            f"no such file: {path}", field="model", fix="check the path to the config.json or ModelSpec file",
        )
    raise _unknown_model(text)


def _hub_model(repo_id: str) -> ModelSpec:
    """A hub id's config.json (cache or download), named after the repository (not its snapshot hash). Where
    neither can give it (offline, gated), the preset of that repository (`preset_of_hub_repo`) stands in, under the
    preset's name, so the substitution shows in every output."""
    try:
        config = resolve_hub_config(repo_id)
    except MegapilotError:
        preset = preset_of_hub_repo(repo_id)
        if preset is None:
            raise
        return preset.spec
    return from_hf_config(_read_mapping(config), repo_id.split("/", 1)[1])


def preset_of_hub_repo(repo_id: str) -> ModelPreset | None:
    """The preset whose first source (as models.yaml cites it) is `repo_id` on the hub: its config.json, or the
    repository's model card where the shape came from the model's Megatron provider (Nemotron-H)."""
    repository = f"https://huggingface.co/{repo_id}".lower()
    cited = {repository, f"{repository}/blob/main/config.json"}
    return next((preset for preset in load_presets().values()
                 if preset.source.split(maxsplit=1)[0].lower() in cited), None)


def preset_by_unique_prefix(name: str) -> ModelPreset | None:
    """The one preset whose name (or alias) continues `name` (`qwen3_30B` -> qwen3-30b-a3b), None when none or
    several do."""
    key = lookup_key(name)
    if len(key) < 4:
        return None
    found = {preset.spec.name: preset for k, preset in _presets_by_key().items() if k.startswith(key)}
    return next(iter(found.values())) if len(found) == 1 else None


def close_presets(name: str, limit: int = 4) -> list[str]:
    """Preset names a mistyped or shortened `name` probably meant.

    Prefixes first (`gpt3` -> `gpt3-175b`: a size left out is the commonest slip), those that continue the
    name after a separator as typed before the rest, then spelling neighbours (difflib) for typos.
    """
    keys, key = _presets_by_key(), lookup_key(name)
    typed = name.strip().lower()
    prefixed = [k for k in keys if k.startswith(key) and k != key] if len(key) >= 2 else []
    literal = [k for k in prefixed if any(n.lower().startswith(typed) and n[len(typed):len(typed) + 1] in "-_. "
                                          for n in (keys[k].spec.name, *keys[k].aliases))]
    spelled = difflib.get_close_matches(key, list(keys), n=limit, cutoff=0.6)
    ordered = literal + prefixed + spelled
    return list(dict.fromkeys(keys[k].spec.name for k in ordered))[:limit]


def _unknown_model(name: str) -> MegapilotError:
    suggestions = close_presets(name)
    hint = f"did you mean {', '.join(suggestions)}? " if suggestions else ""
    return MegapilotError(
        f"unknown model {name!r}",
        field="model",
        fix=f"{hint}run `megapilot models` for the presets, or pass a Hugging Face hub id (org/name), a path to a "
        "config.json (or its directory) or a YAML/JSON file of ModelSpec fields",
    )


def _load_model_file(path: Path) -> ModelSpec:
    """A HF config.json (recognised by `architectures`/`model_type` or its own keys), a saved plan (its model), or
    a file of ModelSpec fields."""
    data = _read_mapping(path)
    if looks_like_hf_config(data):
        return from_hf_config(data, path.parent.name if path.name == "config.json" else path.stem)
    if looks_like_saved_plan(data):  # the model it was planned for
        data = data["model"]
    data.setdefault("name", path.stem)
    try:
        return ModelSpec(**data)
    except ValidationError as exc:
        error = from_validation_error(exc, prefix="model")
        where = (error.field or "model").removeprefix("model.")
        if exc.errors()[0]["type"] == "extra_forbidden":
            fix = f"remove {where} from {path}, or spell it as the ModelSpec field it means"
        elif where != "model":
            fix = f"set {where} in {path} to the model's own value"
        else:  # a rule over several fields
            fix = f"make the fields of {path} agree as the message says"
        raise MegapilotError(error.problem, field=error.field, fix=fix) from exc
    except TypeError as exc:  # keys that are not strings
        raise MegapilotError(f"{path}: {exc}", field="model", fix="use ModelSpec field names as keys") from exc


def _read_mapping(path: Path) -> dict[str, Any]:
    # start-up: yaml costs 18 ms to import, paid only where YAML is read
    import yaml

    try:
        text = path.read_text(encoding="utf-8")
        is_yaml = path.suffix.lower() in (".yaml", ".yml")
        data = yaml.safe_load(text) if is_yaml else json.loads(text)
    except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError) as exc:
        reason = " ".join(str(exc).split())  # YAML errors span lines; the CLI prints one
        raise MegapilotError(
            f"cannot read {path} ({reason})", field="model", fix="pass a valid JSON or YAML file",
        ) from exc
    if not isinstance(data, dict):
        raise MegapilotError(
            f"{path} does not hold a mapping of fields", field="model",
            fix="write the model as `field: value` pairs (ModelSpec) or pass a Hugging Face config.json",
        )
    return data
