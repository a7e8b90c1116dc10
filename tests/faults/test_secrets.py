"""Secrets are never written in clear: not in the inputs a run keeps, its scripts, logs, decks, reports or the
history. Values under secret-like names (TOKEN, KEY, PASSWORD...) or named in `megapilot.secrets` are masked,
and a run directory holding any secret is its owner's alone."""

from __future__ import annotations

import json
import stat
import subprocess
from pathlib import Path

import pytest

from megapilot.suite.config import load_suite
from megapilot.suite.secrets import MASK, secret_values, write_masked_copy
from tests.faults.helpers import fault_env, megapilot_argv, tiny_suite

SECRETS = {"HF_TOKEN": "hf_SECRETtokenValue0123456789", "WANDB_API_KEY": "wandbKEYvalue9876543210",
           "SITE_PASS_PHRASE": "plainNamedButListedSecret42", "AWS_SECRET_ACCESS_KEY": "awsSECRETaccess/KEY+value"}
LISTED = "SITE_PASS_PHRASE"  # a name that does not look secret: listed in megapilot.secrets


def _suite_with_secrets(tmp_path: Path, *, container: bool) -> tuple[Path, Path]:
    config = tiny_suite(tmp_path)
    data = json.loads(config.read_text())
    data["megapilot"]["secrets"] = [LISTED]
    if container:
        data["container"] = {"name": "c", "image": "rocm/megatron:latest", "env": dict(SECRETS, NCCL_DEBUG="WARN")}
    config.write_text(json.dumps(data, indent=2))
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({"username": "root", "head_node_dict": {"mgmt_ip": "127.0.0.1"},
                                   "node_dict": {"127.0.0.1": {"bmc_ip": "NA", "vpc_ip": "127.0.0.1"}},
                                   "env_vars": {**SECRETS, "OMP_NUM_THREADS": "1"}}, indent=2))
    (tmp_path / "hf_token").write_text("hf_FROMtheTOKENfile000111222\n")
    return config, cluster


def _files_text(root: Path) -> str:
    return "\n".join(p.read_bytes().decode("utf-8", "replace") for p in root.rglob("*") if p.is_file())


def test_input_copies_mask_every_secret_and_keep_the_rest(tmp_path: Path) -> None:
    config, cluster = _suite_with_secrets(tmp_path, container=True)
    suite = load_suite(config, cluster)
    assert set(secret_values(suite)) == {*SECRETS.values(), "hf_FROMtheTOKENfile000111222"}
    copies = tmp_path / "copies"
    copies.mkdir()
    for source in (config, cluster):
        target = write_masked_copy(source, copies / source.name, suite)
        text = target.read_text()
        assert not any(value in text for value in SECRETS.values()), source.name
        assert MASK in text and ("OMP_NUM_THREADS" in text or "NCCL_DEBUG" in text)
        assert stat.S_IMODE(target.stat().st_mode) == 0o600
    kept = json.loads((copies / "suite.json").read_text())
    assert kept["container"]["env"]["NCCL_DEBUG"] == "WARN" and kept["container"]["env"][LISTED] == MASK


def test_the_dry_run_shows_no_secret(tmp_path: Path) -> None:
    config, cluster = _suite_with_secrets(tmp_path, container=True)
    done = subprocess.run(megapilot_argv("suite", "run", str(config), "--cluster", str(cluster), "--dry-run",
                                         "--json", "--out", str(tmp_path / "runs")), capture_output=True, text=True,
                          timeout=120, env=fault_env(tmp_path), check=False)
    assert done.returncode == 0, done.stderr
    assert not any(value in done.stdout + done.stderr for value in SECRETS.values())


@pytest.mark.slow
def test_no_file_a_run_wrote_holds_a_secret_and_its_directory_is_private(tmp_path: Path) -> None:
    config, cluster = _suite_with_secrets(tmp_path, container=False)
    done = subprocess.run(megapilot_argv("suite", "run", str(config), "--cluster", str(cluster), "--stage", "smoke",
                                         "--out", str(tmp_path / "runs")), capture_output=True, text=True,
                          timeout=600, env=fault_env(tmp_path), check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    written = _files_text(run_dir) + done.stdout + done.stderr + (tmp_path / "history.sqlite").read_bytes().decode(
        "utf-8", "replace")
    for value in [*SECRETS.values(), "hf_FROMtheTOKENfile000111222"]:
        assert value not in written, value
    assert (run_dir / "smoke" / "launch.sh").is_file()  # the job ran, with its logs and script grepped above
