"""The validation suite end to end on this machine: real Megatron-Core training through `megapilot suite run`.

- the packaged `tiny-local` template passes every stage (smoke, checkpoint save -> resume, 2 combos);
- the same config with thresholds no run can meet fails with reasons and exit 1;
- faults injected into running combos (a rank killed, a hang, an NCCL error line, an OOM line) each fail
  their own combo with the right reason while an untouched combo passes, and no process is left;
- a fake HF token planted in the token file appears in nothing megapilot writes or shows.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.slow

FAKE_TOKEN = "hf_FAKEtokenNEVERshown0123456789"


def _megapilot(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "megapilot.cli.app", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, check=False)


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "MEGAPILOT_HISTORY": str(tmp_path / "history.sqlite"), "OMP_NUM_THREADS": "1"}


def _tiny_local(tmp_path: Path) -> Path:
    done = _megapilot("suite", "init", "tiny-local", "-o", str(tmp_path / "suite.json"))
    assert done.returncode == 0, done.stderr
    return tmp_path / "suite.json"


def _edit(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data, indent=2))


def _all_text_under(root: Path) -> str:
    chunks = []
    for path in root.rglob("*"):
        if path.is_file():
            chunks.append(path.read_bytes().decode("utf-8", "replace"))
    return "\n".join(chunks)


def _process_args() -> str:
    args = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            args.append(" ".join(proc.info["cmdline"] or []))
        except psutil.Error:
            continue
    return "\n".join(args)


def test_tiny_local_template_passes_every_stage_and_leaks_no_token(tmp_path: Path) -> None:
    config = _tiny_local(tmp_path)
    (tmp_path / "hf_token").write_text(FAKE_TOKEN + "\n")
    out = tmp_path / "runs"
    command = [sys.executable, "-m", "megapilot.cli.app", "suite", "run", str(config), "--out", str(out), "--json"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(tmp_path))
    listings = []
    while process.poll() is None:  # what `ps` shows while the suite trains
        listings.append(_process_args())
        time.sleep(1.0)
    stdout, stderr = process.communicate()
    assert process.returncode == 0, stderr[-3000:]
    result = json.loads(stdout)
    assert result["verdict"] == "PASS"
    stages = {(s["name"], s["combo"]): s for s in result["stages"]}
    for name in ("prepare", "preflight", "smoke", "checkpoint", "results", "teardown"):
        assert stages[(name, None)]["verdict"] == "PASS", stages[(name, None)]
    checkpoint_rows = {r["name"]: r for r in stages[("checkpoint", None)]["rows"]}
    assert checkpoint_rows["checkpoint.resume_step"]["value"] == 11  # saved at 10, resumed at 11
    assert checkpoint_rows["checkpoint.loss_continuity"]["verdict"] == "PASS"
    combos = [c for c in result["combos"] if c["key"] != "smoke"]
    assert [c["key"] for c in combos] == ["MBS=1,GBS=8,PRECISION=BF16", "MBS=2,GBS=8,PRECISION=BF16"]
    for combo in combos:
        assert combo["verdict"] == "PASS", combo["reason"]
        rows = {r["name"]: r for r in combo["metrics"]}
        assert rows["training.tokens_per_gpu"]["verdict"] == "PASS" and rows["training.tokens_per_gpu"]["value"] > 50
        assert rows["gate.loss_slope"]["verdict"] == "PASS" and rows["gate.loss_slope"]["value"] < 0
    run_dir = Path(result["run_dir"])
    for name in ("suite.json", "report.html", "megatron_run_deck.json", "junit.xml"):
        assert (run_dir / name).is_file(), name
    # The token reached the job (HF_TOKEN) but nothing megapilot writes or shows.
    assert FAKE_TOKEN not in stdout + stderr
    assert FAKE_TOKEN not in _all_text_under(run_dir)
    assert FAKE_TOKEN.encode() not in (tmp_path / "history.sqlite").read_bytes()
    assert listings and not any(FAKE_TOKEN in listing for listing in listings)
    dry = _megapilot("suite", "run", str(config), "--out", str(out), "--dry-run", "--json", env=_env(tmp_path))
    assert dry.returncode == 0 and FAKE_TOKEN not in dry.stdout + dry.stderr
    history = _megapilot("history", "list", "--json", env=_env(tmp_path))
    assert json.loads(history.stdout)[0]["run_id"] == result["run_id"]


def test_thresholds_no_run_meets_fail_with_reasons_and_exit_1(tmp_path: Path) -> None:
    config = _tiny_local(tmp_path)
    thresholds = tmp_path / "tiny-local_threshold.json"
    _edit(thresholds, lambda t: [cell.update({"training.tokens_per_gpu": {"kind": "min", "value": 1e12}})
                                 for key, cell in t.items() if not key.startswith("_")])
    combo = "MBS=1,GBS=8,PRECISION=BF16"
    done = _megapilot("suite", "run", str(config), "--out", str(tmp_path / "runs"), "--stage", "train", "--combo",
                      combo,
                      "--json", env=_env(tmp_path))
    assert done.returncode == 1, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["verdict"] == "FAIL"
    ran = next(c for c in result["combos"] if c["key"] == combo)
    row = next(r for r in ran["metrics"] if r["name"] == "training.tokens_per_gpu")
    assert row["verdict"] == "FAIL" and row["threshold"] == ">= 1e+12" and "< 1e+12" in row["reason"]
    assert "training.tokens_per_gpu" in ran["reason"]
    assert Path(result["run_dir"], "report.html").is_file()  # a report even when the suite fails


# ---- faults ---------------------------------------------------------------------------------------------------

FAULT_CELLS = {
    "MBS=1,GBS=8,PRECISION=BF16": "kill_rank",
    "MBS=2,GBS=8,PRECISION=BF16": "none",
    "MBS=1,GBS=4,PRECISION=BF16": "hang",
    "MBS=2,GBS=4,PRECISION=BF16": "nccl_error",
    "MBS=4,GBS=8,PRECISION=BF16": "oom",
}
FAULT_LINES = {
    "nccl_error": "[rank1]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, "
                  "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5",
    "oom": "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
           "capacity of 79.11 GiB of which 1.05 GiB is free.",
}


def _slug(key: str) -> str:
    mbs, gbs, precision = (part.split("=")[1] for part in key.split(","))
    return f"MBS{mbs}_GBS{gbs}_{precision}"


def _job_processes(job_dir: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("MEGAPILOT_JOB_DIR") == str(job_dir):
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def _trainer_ranks(job_dir: Path) -> list[psutil.Process]:
    ranks = []
    for proc in _job_processes(job_dir):
        try:
            cmdline = proc.cmdline()
        except psutil.Error:
            continue
        if "megapilot.trainer" in cmdline and "torch.distributed.run" not in " ".join(cmdline):
            ranks.append(proc)
    return ranks


def _iterations_logged(log: Path) -> bool:
    return log.is_file() and " iteration " in log.read_text(errors="replace")


def _inject(out: Path, stop: threading.Event, done: dict[str, str]) -> None:
    """Wait for each faulty combo to log an iteration, then break it the way its name says."""
    while not stop.is_set():
        for key, fault in FAULT_CELLS.items():
            if fault == "none" or key in done:
                continue
            for job_dir in out.glob(f"*/{_slug(key)}"):
                log = job_dir / "out-node0" / "training.log"
                if not _iterations_logged(log):
                    continue
                if fault in FAULT_LINES:
                    with log.open("a") as handle:
                        handle.write(FAULT_LINES[fault] + "\n")
                    done[key] = fault
                    continue
                ranks = _trainer_ranks(job_dir.resolve())
                if len(ranks) < 2:
                    continue
                if fault == "kill_rank":
                    ranks[-1].send_signal(signal.SIGKILL)
                else:  # hang: freeze every process of the job
                    for proc in _job_processes(job_dir.resolve()):
                        proc.send_signal(signal.SIGSTOP)
                done[key] = fault
        time.sleep(0.2)


def test_each_fault_fails_its_own_combo_and_the_healthy_one_passes(tmp_path: Path) -> None:
    config = _tiny_local(tmp_path)

    def fault_suite(data: dict) -> None:
        data["enforce_thresholds"] = False
        data["threshold_json"] = ""
        data["smoke"]["enabled"] = False
        data["checkpoint"]["enforce"] = False
        data["train_params"]["training_iterations"] = "40"
        data["sweep"] = {"combinations": {key: {} for key in FAULT_CELLS}, "runs": list(FAULT_CELLS)}
        data["megapilot"]["startup_timeout_s"] = 30  # the hang window: 30 s without a new iteration line
        data["megapilot"]["hang_factor"] = 10

    _edit(config, fault_suite)
    (tmp_path / "tiny-local_threshold.json").unlink()
    out = tmp_path / "runs"
    stop, injected = threading.Event(), {}
    injector = threading.Thread(target=_inject, args=(out, stop, injected), daemon=True)
    injector.start()
    try:
        done = _megapilot("suite", "run", str(config), "--out", str(out), "--json", env=_env(tmp_path))
    finally:
        stop.set()
        injector.join(timeout=5)
    assert done.returncode == 1, done.stderr[-3000:]
    result = json.loads(done.stdout)
    combos = {c["key"]: c for c in result["combos"]}
    assert injected == {k: v for k, v in FAULT_CELLS.items() if v != "none"}
    assert combos["MBS=2,GBS=8,PRECISION=BF16"]["verdict"] == "PASS", combos["MBS=2,GBS=8,PRECISION=BF16"]["reason"]
    killed = combos["MBS=1,GBS=8,PRECISION=BF16"]
    assert killed["verdict"] == "FAIL" and killed["job"]["state"] == "FAILED"
    assert "SIGKILL" in killed["reason"] or "signal 9" in killed["reason"], killed["reason"]
    hung = combos["MBS=1,GBS=4,PRECISION=BF16"]
    assert hung["verdict"] == "FAIL" and hung["job"]["state"] == "HUNG", hung["reason"]
    nccl = combos["MBS=2,GBS=4,PRECISION=BF16"]
    assert nccl["verdict"] == "FAIL" and "nccl_error" in nccl["reason"] and nccl["findings"][0]["node"] == 0
    assert FAULT_LINES["nccl_error"][:40] in nccl["findings"][0]["evidence"][0]["text"]
    oom = combos["MBS=4,GBS=8,PRECISION=BF16"]
    assert oom["verdict"] == "FAIL" and "oom" in oom["reason"]
    teardown = next(s for s in result["stages"] if s["name"] == "teardown")
    assert teardown["verdict"] == "PASS", teardown["reason"]
    run_dir = Path(result["run_dir"]).resolve()
    assert not [p for p in psutil.process_iter() if _marker_under(p, run_dir)]


def _marker_under(proc: psutil.Process, run_dir: Path) -> bool:
    try:
        return proc.environ().get("MEGAPILOT_JOB_DIR", "").startswith(str(run_dir))
    except (psutil.Error, OSError):
        return False


def test_piped_run_shows_stages_progress_and_ends_with_the_paths(tmp_path: Path) -> None:
    config = _tiny_local(tmp_path)

    first = json.loads(config.read_text())["sweep"]["runs"][0]
    done = _megapilot("suite", "run", str(config), "--out", str(tmp_path / "runs"), "--stage", "train",
                      "--combo", first, env=_env(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stderr.splitlines()
    assert any(line.startswith("[1/") and "stage prepare" in line for line in lines), done.stderr[-3000:]
    assert any("following " in line and line.endswith("training.log") for line in lines)
    progress = [line for line in lines if ": iteration " in line]
    assert progress and all(" s/it" in line or "iteration 0/" in line for line in progress[1:])
    assert [line.split(":")[0] for line in lines[-3:]] == ["report", "run deck", "JUnit"]
    assert all(Path(line.split(": ", 1)[1]).is_file() for line in lines[-3:])
