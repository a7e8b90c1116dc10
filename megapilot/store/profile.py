"""The saved user profile: first-run inputs (GPU, node size, data, tokenizer) kept as TOML.

`megapilot profile set` writes it once; later commands (`plan`, `script`) read it for the flags the
user left out and say where each default came from. The file lives in the user config dir
(`platformdirs.user_config_dir("megapilot")/profile.toml`); `$MEGAPILOT_PROFILE` or an explicit
path (`--profile FILE`) overrides the location.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from megapilot.compat import tomllib
from megapilot.errors import MegapilotError, from_validation_error
from megapilot.limits import MAX_GPUS

PROFILE_ENV = "MEGAPILOT_PROFILE"
PROFILE_FILE_NAME = "profile.toml"


class Profile(BaseModel):
    """A user's standing inputs. Every field is optional: an empty profile changes nothing."""

    model_config = ConfigDict(extra="forbid")

    gpu: str | None = Field(default=None, description="GPU name or alias, e.g. H100.")
    # the bound `plan` and `estimate` hold --gpus to: a value they would refuse is refused when it is saved
    gpus: int | None = Field(default=None, gt=0, le=MAX_GPUS, description="Total GPUs usually available.")
    gpus_per_node: int | None = Field(default=None, gt=0, description="GPUs per node.")
    data_path: str | None = Field(default=None, description="Megatron --data-path prefix.")
    tokenizer: str | None = Field(default=None, description="Tokenizer model or HF name.")
    save_dir: str | None = Field(default=None, description="Checkpoint directory (--save).")
    source: str | None = Field(default=None, exclude=True, description="File this profile was read from.")

    @field_validator("data_path", "save_dir")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        # `script` writes these into the launch as they are, and refuses a relative one there as if it were a flag
        if value is not None and not value.startswith("/"):
            raise ValueError(f"{value!r} is not an absolute path (the launch script runs from another directory)")
        return value

    @field_validator("gpu", "tokenizer")
    @classmethod
    def _not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("is empty (an empty value is not 'unset')")
        return value

    def values(self) -> dict[str, object]:
        """The fields that are set, without the bookkeeping `source`."""
        return self.model_dump(exclude_none=True, exclude={"source"})

    def default_note(self, field: str) -> str:
        """How to tell the user a default came from here, e.g. `gpu=H100 from profile ~/.config/...`."""
        return f"{field}={getattr(self, field)} from profile {self.source}"


def profile_path(path: str | os.PathLike[str] | None = None) -> Path:
    """Where the profile lives: explicit path, else $MEGAPILOT_PROFILE, else the user config dir."""
    if path:
        return Path(path).expanduser()
    from_env = os.environ.get(PROFILE_ENV)
    if from_env:
        return Path(from_env).expanduser()
    # start-up: platformdirs (9 ms) only where the default path is needed
    import platformdirs

    return Path(platformdirs.user_config_dir("megapilot")) / PROFILE_FILE_NAME


def load_profile(path: str | os.PathLike[str] | None = None) -> Profile:
    """Read the profile; a missing file is an empty profile, a broken one a MegapilotError."""
    location = profile_path(path)
    if not location.is_file():
        if path:  # the user named this file, so its absence is a mistake worth reporting
            raise MegapilotError(f"no profile at {location}", field="profile",
                                 fix="run `megapilot profile set ...` first or pass an existing file")
        return Profile()
    try:
        raw = tomllib.loads(location.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise MegapilotError(f"{location} is not valid TOML ({exc})", field="profile",
                             fix="fix the syntax or rewrite it with `megapilot profile set`") from None
    try:
        return Profile(**raw, source=str(location))
    except ValidationError as exc:
        error = from_validation_error(exc, prefix="profile")
        key = (error.field or "profile").removeprefix("profile.")
        raise MegapilotError(f"{location}: {error.problem}", field=error.field,
                             fix=error.fix or f"correct {key} in {location}, or rewrite it with "
                                              f"`megapilot profile set --{key.replace('_', '-')} ...`") from None


# What each text field takes, for the fix of a refused `profile set`.
_FIXES = {"data_path": "an absolute path, e.g. /data/corpus_text_document",
          "save_dir": "an absolute path, e.g. /ckpt/run1",
          "tokenizer": "a tokenizer path or a Hugging Face id", "gpu": "a GPU name such as h100"}


def save_profile(path: str | os.PathLike[str] | None = None, *, merge: bool = True, **fields: object) -> Profile:
    """Write the given fields (None = leave as is) to the profile, merged over what is there."""
    location = profile_path(path)
    current = load_profile(location).values() if merge and location.is_file() else {}
    current.update({k: v for k, v in fields.items() if v is not None})
    try:
        profile = Profile.model_validate(current)
    except ValidationError as exc:
        error = from_validation_error(exc, prefix="profile")
        key = (error.field or "profile").removeprefix("profile.")
        raise MegapilotError(error.problem, field=f"--{key.replace('_', '-')}",
                             fix=f"pass --{key.replace('_', '-')} with a valid value ({_FIXES.get(key, 'see --help')})"
                             ) from None
    # start-up: tomli_w only when a profile is saved
    import tomli_w

    location.parent.mkdir(parents=True, exist_ok=True)
    location.write_text(tomli_w.dumps(profile.values()))
    return profile.model_copy(update={"source": str(location)})
