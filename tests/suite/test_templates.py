"""Every packaged template: CVS schema with placeholders where CVS has them; filled in, it checks clean."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from megapilot.suite.config import check_suite
from megapilot.suite.render import render_cells
from megapilot.suite.templates import list_templates, template_path, threshold_paths

CVS_TEMPLATES = [t.name for t in list_templates() if t.name != "tiny-local"]


@pytest.mark.parametrize("name", CVS_TEMPLATES)
def test_cvs_templates_hold_changeme_until_filled_then_render(tmp_path: Path, name: str) -> None:
    assert {p.path for p in check_suite(template_path(name)).problems} >= {"gpu_name", "container.image",
                                                                           "train_params.training_iterations"}
    raw = json.loads(template_path(name).read_text())
    for gpu in ("h100", "mi355x"):
        (threshold,) = [p for p in threshold_paths(name) if f".{gpu}_" in p.name]
        assert "uncalibrated" in json.loads(threshold.read_text())["_comment"]
        shutil.copyfile(threshold, tmp_path / threshold.name)
        raw.update(gpu_name=gpu.upper(), threshold_json=threshold.name)
        raw["container"]["image"] = "rocm/megatron-lm:v25.9"
        raw["train_params"]["training_iterations"] = "20"
        raw["container"]["env"] = {k: "10.0.0.1" for k in raw["container"]["env"]}
        (tmp_path / "suite.json").write_text(json.dumps(raw))
        check = check_suite(tmp_path / "suite.json")
        assert check.ok, check.problems
        launches = render_cells(check.suite, tmp_path / "run")
        assert all(launch.error is None for launch in launches)
        assert any(launch.runnable for launch in launches)


def test_every_template_has_threshold_files_for_six_gpus() -> None:
    for name in CVS_TEMPLATES:
        assert len(threshold_paths(name)) == 6


def test_tiny_local_checks_clean_as_shipped() -> None:
    check = check_suite(template_path("tiny-local"))
    assert check.ok and not check.warnings
    suite = check.suite
    assert (suite.backend, suite.device, suite.gpu, suite.gpus_per_node) == ("megapilot", "cpu", None, 2)
    assert [c.key for c in suite.cells] == ["MBS=1,GBS=8,PRECISION=BF16", "MBS=2,GBS=8,PRECISION=BF16"]
    assert suite.smoke.train_iters == 5 and suite.config.checkpoint.enforce
    assert suite.config.loss_curve.sample_every == 2
    assert suite.config_path.parent == suite.hf_token_file.parent  # relative paths anchor at the config
