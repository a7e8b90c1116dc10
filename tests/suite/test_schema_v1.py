"""CVS's schema v1 (Aug 2026) configs read as the Sep 2026 schema, and the legacy per-model form refused, on real
files from ROCm/cvs (tests/data/cvs/schema_v1, tests/data/cvs/legacy)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from megapilot.suite.config import V1_READ_NOTE, check_suite
from megapilot.suite.schema_v1 import is_schema_v1, upgrade_v1
from tests.suite.cvs_files import CVS_DIR

V1_DIR = CVS_DIR / "schema_v1"
V1_DISTRIBUTED = "mi325x_megatron_llama-3.3-70b_distributed.json"
V1_SINGLE = "mi325x_megatron_deepseek-v2-lite_single.json"


def _v1(name: str) -> dict:
    return json.loads((V1_DIR / name).read_text())


def _write(tmp_path: Path, raw: dict, threshold_of: str) -> Path:
    """The config beside its own threshold file (the name the config gives), as CVS ships them."""
    shutil.copyfile(V1_DIR / threshold_of.replace(".json", "_threshold.json"), tmp_path / raw["threshold_json"])
    path = tmp_path / "suite.json"
    path.write_text(json.dumps(raw))
    return path


def test_a_shipped_v1_distributed_config_names_its_placeholders_where_the_file_has_them() -> None:
    """The leftover <changeme> values are reported at the file's own paths (config.master_address), the leftover
    result_dict and the settings the Sep 2026 schema has no place for are warnings, and nothing asks for the newer
    schema's gpu_name, paths or train_params."""
    check = check_suite(V1_DIR / V1_DISTRIBUTED)
    assert {p.path for p in check.problems} == {
        "container.image", "config.master_address", "config.nccl_socket_ifname", "config.gloo_socket_ifname",
        "config.nccl_ib_hca_list"}
    assert V1_READ_NOTE in check.warnings
    assert any("result_dict: not read" in w for w in check.warnings)
    assert any(w.startswith("config.nnodes:") for w in check.warnings)


def test_a_filled_in_v1_single_node_config_runs_with_its_settings_moved(tmp_path: Path) -> None:
    raw = _v1(V1_SINGLE)
    raw["container"]["image"] = "rocm/megatron-lm:v25.9"
    check = check_suite(_write(tmp_path, raw, V1_SINGLE))
    assert check.ok, check.problems
    suite = check.suite
    assert suite is not None
    config = suite.config
    assert config.gpu_name == "MI325X"
    assert config.paths.log_dir.endswith("/LOGS/megatron")
    assert config.train_params.training_iterations == 10
    assert config.container is not None and config.container.env["MASTER_ADDR"] == "127.0.0.1"
    assert config.container.env["NCCL_SOCKET_IFNAME"] == "ensf1np1"
    assert config.megapilot.megatron_path == "/workspace/Megatron-LM"
    assert config.megapilot.nodes == 1
    assert suite.model.name == "deepseek-v2-lite"
    assert [cell.key for cell in suite.cells] == list(config.sweep.runs)
    assert all(key.startswith("MBS=") for key in config.sweep.runs)


def test_v1_combination_ids_become_cell_keys_and_their_runs_follow() -> None:
    raw = _v1(V1_DISTRIBUTED)
    upgraded = upgrade_v1(raw)
    assert is_schema_v1(raw)
    assert upgraded.config["sweep"]["runs"] == ["MBS=1,GBS=64,PRECISION=FP8", "MBS=1,GBS=64,PRECISION=BF16"]
    assert "result_dict" not in upgraded.config["sweep"]["combinations"]["MBS=1,GBS=64,PRECISION=FP8"]
    assert upgraded.original_path("sweep.combinations.MBS=1,GBS=64,PRECISION=FP8.precision") == (
        "sweep.combinations.llama3_3_70b-mi325-bs64-mbs1-fp8.precision")


def test_cvs_short_gpu_names_te_precisions_and_a_loose_model_name_are_understood(tmp_path: Path) -> None:
    """Older CVS files say mi325 and TE_FP8 / TE_BF16, and name Qwen3-30B-A3B `qwen3_30B` beside its HF id."""
    raw = _v1(V1_SINGLE)
    raw["container"]["image"] = "rocm/megatron-lm:v25.9"
    raw["gpu_arch"] = "mi325"
    raw["model_params"] |= {"model_name": "qwen3_30B", "tokenizer_model": "Qwen/Qwen3-30B-A3B", "precision": "TE_FP8"}
    combination = next(iter(raw["sweep"]["combinations"].values()))
    combination["precision"] = "TE_BF16"
    check = check_suite(_write(tmp_path, raw, V1_SINGLE))
    # the threshold file has no TE_BF16 cell of its own: the key reads as BF16, which it has
    assert check.ok, check.problems
    assert check.suite is not None and check.suite.model.name == "qwen3-30b-a3b"
    assert check.suite.gpu is not None and check.suite.gpu.name == "MI325X"
    assert any("read as the qwen3-30b-a3b preset" in w for w in check.warnings)


def test_the_legacy_per_model_form_is_refused_with_what_to_write() -> None:
    check = check_suite(CVS_DIR / "legacy" / "mi3xx_megatron_llama_single.json")
    assert [p.path for p in check.problems] == ["model_params"]
    assert "names several models and GPUs" in check.problems[0].message
    assert "MBS=<micro_batch_size>,GBS=<batch_size>" in check.problems[0].fix


def test_a_threshold_file_with_a_trailing_comma_says_where(tmp_path: Path) -> None:
    raw = _v1(V1_SINGLE)
    raw["container"]["image"] = "rocm/megatron-lm:v25.9"
    path = _write(tmp_path, raw, V1_SINGLE)
    threshold = tmp_path / raw["threshold_json"]
    threshold.write_text(threshold.read_text().replace("}\n  },", "},\n  },", 1))
    unreadable = [p for p in check_suite(path).problems if p.path == "threshold_json"]
    assert len(unreadable) == 1 and "comes before a closing bracket" in unreadable[0].message
