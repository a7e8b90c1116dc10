"""CVS's earlier Megatron config schemas, read into the Sep 2026 one the suite validates.

CVS changed its Megatron config twice in 2026:

- **schema v1** (`schema_version: 1`, Aug 2026, PR #307 "Orch refactored Megatron Single-Node & Distributed"):
  `gpu_arch`; one lowercase `config{}` block holding the paths, the iteration count, the node count and the
  network settings; `model_params{}`; sweep combinations under free-form ids whose bodies carry
  `micro_batch_size`, `global_batch_size` and `precision` (the threshold cell key was derived from them), some
  still with a leftover `result_dict`. It is read here, field by field, into the Sep 2026 names: `gpu_name`,
  `paths{}`, `train_params{}`, `container.env{}`, `megapilot.nodes` and `MBS=..,GBS=..,PRECISION=..` combination
  keys. What the newer schema has no place for is dropped with a warning naming where it went. Problems found later
  name the path the file has (`config.master_address`, not `container.env.MASTER_ADDR`).
- **the legacy nested form** (`model_params.single_node|multi_node.<model>.<gpu>{...}`, the per-model suites before
  PR #307): one file for several models and GPUs, with expectations in `result_dict`. It names no single run, so it
  is refused with the fields to write instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from megapilot.suite.cells import cell_key_text

SCHEMA_V1 = 1
_V1_PATHS = ("hf_token_file", "log_dir", "scripts_dir", "data_cache_dir", "rocm_dir")
# config{} keys whose value is an environment variable of the container (CVS's later `container.env`)
_V1_ENV = {
    "master_address": "MASTER_ADDR",
    "nccl_socket_ifname": "NCCL_SOCKET_IFNAME",
    "gloo_socket_ifname": "GLOO_SOCKET_IFNAME",
    "nccl_ib_gid_index": "NCCL_IB_GID_INDEX",
    "nccl_debug": "NCCL_DEBUG",
}
_V1_HCA = ("nccl_ib_hca_list", "nccl_ib_hca")  # the list wins: CVS v1 exported it as NCCL_IB_HCA
_V1_DROPPED = {
    "nic_type": "NIC checks read the links themselves (megapilot.expected_nic_gbps sets the speed to expect)",
    "hca_id_pattern": "the HCAs are named by NCCL_IB_HCA",
}
_COMBO_CELL_FIELDS = ("micro_batch_size", "global_batch_size", "precision")
_COMBO_DROPPED = ("name", "result_dict")
_V1_ONLY_TOP_LEVEL = ("schema_version", "framework", "gpu_arch", "config", "model_params", "sweep")


@dataclass
class Upgrade:
    """A schema v1 config in the Sep 2026 names, a warning for each setting that moved or was dropped, and where
    each moved setting sits in the file (new dotted path -> the file's), so problems name what the user wrote."""

    config: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    renamed: dict[str, str] = field(default_factory=dict)

    def original_path(self, path: str) -> str:
        """`path` as the file spells it: its longest renamed prefix put back."""
        for new in sorted(self.renamed, key=len, reverse=True):
            if path == new or path.startswith(new + "."):
                return self.renamed[new] + path[len(new):]
        return path


def is_legacy_nested(raw: dict[str, Any]) -> bool:
    """The per-model suites' form: model_params keyed by single_node / multi_node, then model, then GPU."""
    params = raw.get("model_params")
    return isinstance(params, dict) and any(isinstance(params.get(k), dict) for k in ("single_node", "multi_node"))


def is_schema_v1(raw: dict[str, Any]) -> bool:
    """`schema_version: 1`, or its shape (config{} and model_params{} without the newer train_params)."""
    if str(raw.get("schema_version", "")).strip() == str(SCHEMA_V1):
        return True
    return isinstance(raw.get("config"), dict) and isinstance(raw.get("model_params"), dict) \
        and "train_params" not in raw and not is_legacy_nested(raw)


def legacy_problem() -> tuple[str, str]:
    """Why a legacy nested config cannot run as it is, and what to write instead (message, fix)."""
    return ("the legacy per-model form (model_params.single_node|multi_node.<model>.<gpu>) names several models "
            "and GPUs but no single run",
            "write one suite per model: gpu_name, paths{hf_token_file, log_dir, scripts_dir, data_cache_dir}, "
            "container{name, image}, train_params{model_name, tokenizer_model, model_size, sequence_length, "
            "tensor_parallelism, pipeline_parallelism, recompute, fsdp, training_iterations} and one sweep "
            "combination MBS=<micro_batch_size>,GBS=<batch_size>,PRECISION=<precision> per cell "
            "(`megapilot suite init` copies a template)")


def upgrade_v1(raw: dict[str, Any]) -> Upgrade:
    """Read a schema v1 config into the Sep 2026 names (module doc)."""
    done = Upgrade()
    settings = dict(raw.get("config") or {})
    out = {k: v for k, v in raw.items() if k not in _V1_ONLY_TOP_LEVEL}
    if "gpu_arch" in raw and "gpu_name" not in raw:
        out["gpu_name"] = raw["gpu_arch"]
        done.renamed["gpu_name"] = "gpu_arch"
    out["paths"] = {**_take(settings, _V1_PATHS, "paths", done), **(raw.get("paths") or {})}
    train_params = dict(raw.get("model_params") or {})
    done.renamed["train_params"] = "model_params"
    if "training_iterations" in settings and "training_iterations" not in train_params:
        train_params["training_iterations"] = settings.pop("training_iterations")
        done.renamed["train_params.training_iterations"] = "config.training_iterations"
    out["train_params"] = train_params
    if "verify_network_errors" in settings and "verify_network_errors" not in out:
        out["verify_network_errors"] = settings.pop("verify_network_errors")
        done.renamed["verify_network_errors"] = "config.verify_network_errors"
    _move_environment(settings, out, done)
    _move_megapilot_settings(settings, out, done)
    for key, where in _V1_DROPPED.items():
        if key in settings:
            settings.pop(key)
            done.warnings.append(f"config.{key}: not read (schema v1 setting); {where}")
    done.warnings += [f"config.{key}: not read (schema v1 setting with no place in the Sep 2026 schema)"
                      for key in settings]
    if "sweep" in raw:
        out["sweep"] = _upgrade_sweep(raw["sweep"], train_params, done)
    done.config = out
    return done


def _take(settings: dict[str, Any], keys: tuple[str, ...], block: str, done: Upgrade) -> dict[str, Any]:
    taken = {key: settings.pop(key) for key in keys if key in settings}
    done.renamed.update({f"{block}.{key}": f"config.{key}" for key in taken})
    return taken


def _move_environment(settings: dict[str, Any], out: dict[str, Any], done: Upgrade) -> None:
    env: dict[str, Any] = {}
    for key, name in _V1_ENV.items():
        if key in settings:
            env[name] = settings.pop(key)
            done.renamed[f"container.env.{name}"] = f"config.{key}"
    hca_key = next((key for key in _V1_HCA if key in settings), None)
    if hca_key is not None:
        env["NCCL_IB_HCA"] = settings[hca_key]
        done.renamed["container.env.NCCL_IB_HCA"] = f"config.{hca_key}"
    for key in _V1_HCA:
        settings.pop(key, None)
    if not env:
        return
    container = out.get("container")
    if not isinstance(container, dict):
        done.warnings.append(f"config: {', '.join(sorted(env))} not set, as the config has no container to set "
                             "them in")
        return
    out["container"] = {**container, "env": {**env, **(container.get("env") or {})}}


def _move_megapilot_settings(settings: dict[str, Any], out: dict[str, Any], done: Upgrade) -> None:
    """The Megatron checkout and the node count, which v1 kept in config{}, into megapilot's own block: a node count
    written there is the run's (CVS v1 exported it as NNODES); a placeholder left there defers to the cluster file."""
    block = dict(out.get("megapilot") or {})
    root = settings.pop("megatron_root", None)
    if root is not None and "megatron_path" not in block:
        block["megatron_path"] = root
        done.renamed["megapilot.megatron_path"] = "config.megatron_root"
    nodes = settings.pop("nnodes", None)
    if nodes is not None and "nodes" not in block:
        if str(nodes).strip().isdigit():
            block["nodes"] = int(str(nodes).strip())
            done.renamed["megapilot.nodes"] = "config.nnodes"
        else:
            done.warnings.append(f"config.nnodes: {nodes!r} is not a node count; the cluster file's count is used")
    if block:
        out["megapilot"] = block


def _upgrade_sweep(sweep: Any, train_params: dict[str, Any], done: Upgrade) -> Any:
    """Free-form combination ids -> `MBS=..,GBS=..,PRECISION=..` keys (as v1 derived the threshold cell key); the
    runs follow their combinations. A sweep of another shape is left for validation to report."""
    if not isinstance(sweep, dict) or not isinstance(sweep.get("combinations"), dict):
        return sweep
    keys: dict[str, str] = {}
    combinations: dict[str, Any] = {}
    for combo_id, body in sweep["combinations"].items():
        cell = {name: body.get(name, train_params.get(name)) for name in _COMBO_CELL_FIELDS} \
            if isinstance(body, dict) else {}
        if not cell or any(value is None for value in cell.values()):
            combinations[combo_id] = body  # validation names what is missing
            continue
        key = cell_key_text(*(cell[name] for name in _COMBO_CELL_FIELDS))
        if "result_dict" in body:
            done.warnings.append(f"sweep.combinations.{combo_id}.result_dict: not read; thresholds come from the "
                                 "threshold file")
        combinations[key] = {k: v for k, v in body.items() if k not in _COMBO_DROPPED}
        keys[combo_id] = key
        done.renamed[f"sweep.combinations.{key}"] = f"sweep.combinations.{combo_id}"
    runs = [keys.get(run, run) if isinstance(run, str) else run for run in sweep.get("runs", [])]
    return {**sweep, "combinations": combinations, "runs": runs}
