"""A one-time change of step time that stays: found on logs as multi-rank runs write them, never on their noise."""

from __future__ import annotations

import datetime
import random
from dataclasses import dataclass
from pathlib import Path

import pytest

from megapilot.diagnose import diagnose
from megapilot.diagnose.step_change import find_step_change

START = datetime.datetime(2026, 12, 1, 8, 0, 0)


@dataclass
class Run:
    """What a generated log holds. SYNTHETIC: the layout of Megatron-LM's lines as a 16-rank torchrun job's merged
    stdout shows them (`[rankN]:` prefixes, NCCL INFO chatter, a Python warning, checkpoint saves), numbers made up."""

    iterations: int = 500
    base_ms: float = 1200.0
    jitter: float = 0.03  # relative sigma of the step time
    factor: float = 1.0  # step time x factor from iteration `at` on
    at: int = 160
    log_interval: int = 1
    save_interval: int = 0
    save_spike: float = 1.0  # the step time of the interval holding a save, x (older Megatron timed the save in)
    startup: tuple[float, ...] = (4.0, 1.6, 1.15)  # the first iterations' step time, x
    rampup: tuple[int, int, int] | None = None  # start GBS, increment, iterations per increment
    gbs: int = 256
    straggler_from: int | None = None  # from this iteration on --log-straggler reports name rank 5 at 1.4x
    seed: int = 7


def write_log(path: Path, run: Run) -> Path:
    rng = random.Random(run.seed)
    clock = START
    consumed = 0
    lines = [
        "[rank0]:using world size: 16, data-parallel size: 4, context-parallel size: 1, tensor-model-parallel size: 2, "
        "pipeline-model-parallel size: 2",
        "[rank3]:/usr/local/lib/python3.12/dist-packages/torch/distributed/c10d_logger.py:83: FutureWarning: "
        "`torch.distributed._all_gather_base` is a private function and will be deprecated.",
        f"[rank0]:[before the start of training step] datetime: {clock:%Y-%m-%d %H:%M:%S}",
    ]
    since_log_ms: list[float] = []
    saved_in_interval = False
    for iteration in range(1, run.iterations + 1):
        gbs = run.gbs
        if run.rampup is not None:
            start, step, every = run.rampup
            gbs = min(run.gbs, start + step * ((iteration - 1) // every))
        step_ms = run.base_ms * gbs / run.gbs * (1 + rng.gauss(0, run.jitter))
        if iteration <= len(run.startup):
            step_ms *= run.startup[iteration - 1]
        if iteration >= run.at:
            step_ms *= run.factor
        if saved_in_interval:
            step_ms *= run.save_spike
            saved_in_interval = False
        consumed += gbs
        clock += datetime.timedelta(milliseconds=step_ms)
        since_log_ms.append(step_ms)
        for _ in range(rng.randint(0, 3)):
            rank = rng.randrange(16)
            lines.append(f"[rank{rank}]:gpu-node{rank // 8}:{4000 + rank}:{4100 + rank} [{rank % 8}] NCCL INFO "
                         f"Channel {rng.randrange(16):02d}/0 : {rank}[{rank % 8}] -> {(rank + 1) % 16}[0] via P2P/IPC")
        if iteration % run.log_interval:
            continue
        elapsed = sum(since_log_ms) / len(since_log_ms)
        since_log_ms = []
        lines.append(
            f"[rank15]: [{clock:%Y-%m-%d %H:%M:%S.%f}] iteration {iteration:8d}/  100000 | consumed samples: "
            f"{consumed:12d} | elapsed time per iteration (ms): {elapsed:.1f} | throughput per GPU (TFLOP/s/GPU): "
            f"{420 * run.base_ms / elapsed * gbs / run.gbs:.1f} | learning rate: 3.000000E-04 | global batch size: "
            f"{gbs:5d} | lm loss: {9.0 - iteration * 0.004:.6E} | loss scale: 1.0 | grad norm: "
            f"{1.0 + rng.random():.3f} | number of skipped iterations:   0 | number of nan iterations:   0 |")
        if run.straggler_from is not None:
            slow = iteration >= run.straggler_from
            fastest = 1100 + rng.random() * 10
            lines.append(f"[rank0]:[{clock:%Y-%m-%d %H:%M:%S}] | MnRtt/Rnk: {fastest:.2f}ms/2 | MxRtt/Rnk: "
                         f"{fastest * (1.4 if slow else 1.02):.2f}ms/{5 if slow else rng.randrange(16)} | "
                         f"MnEtpt/Rnk: {(360 if slow else 500):.2f}TF/5 | MxEtpt/Rnk: 511.87TF/2")
        if run.save_interval and iteration % run.save_interval == 0:
            lines.append(f"[rank0]:[{clock:%Y-%m-%d %H:%M:%S.%f}] saving checkpoint at iteration {iteration:7d} to "
                         "/lustre/ckpt/llama in torch_dist format")
            clock += datetime.timedelta(seconds=25)
            lines.append(f"[rank0]:  [{clock:%Y-%m-%d %H:%M:%S.%f}] successfully saved checkpoint from iteration "
                         f"{iteration:7d} to /lustre/ckpt/llama [ t 1/2, p 1/2 ]")
            saved_in_interval = True
    path.write_text("\n".join(lines) + "\n")
    return path


def step_findings(path: Path) -> list:
    return [f for f in diagnose([path]).findings if f.category == "slowdown"]


def test_a_jump_that_stays_is_told_with_its_levels_iteration_and_causes_in_order(tmp_path: Path):
    """The QA run: +32 % at iteration 160 of 500, 3 % jitter: it read 'no problem found' (or, longer, a steady
    trend it is not)."""
    log = write_log(tmp_path / "training.log", Run(factor=1.32))
    (finding,) = step_findings(log)
    assert finding.severity == "warning"
    assert finding.title.startswith("Step time rose from 1,2")
    assert "ms to 1,5" in finding.title and "at iteration 160 (+3" in finding.title
    assert "and stayed there to iteration 500" in finding.title
    shown = [int(e.text.split("iteration")[1].split("/")[0]) for e in finding.evidence]
    assert shown[:4] == [158, 159, 160, 161] and shown[-1] == 500  # around the change, and that it stayed
    assert "steady trend" not in finding.cause and "not a drift" in finding.cause
    order = [finding.cause.index(word) for word in ("throttle", "checkpoint saves", "another job", "data loader",
                                                    "batch ramp-up" if "ramp-up" in finding.cause else "work per step")]
    assert order == sorted(order)
    assert "global batch size stayed 256" in finding.cause
    flags = {fix.flag for fix in finding.fixes}
    assert {"--timing-log-level", "--log-straggler"} <= flags


def test_a_jump_between_logged_intervals_names_both_iterations(tmp_path: Path):
    log = write_log(tmp_path / "training.log", Run(iterations=3000, log_interval=10, factor=1.25, at=1605))
    (finding,) = step_findings(log)
    assert "between iterations 1600 and 1610 (+2" in finding.title


def test_a_run_that_got_faster_is_a_note(tmp_path: Path):
    log = write_log(tmp_path / "training.log", Run(factor=0.75, at=220))
    (finding,) = step_findings(log)
    assert finding.severity == "info" and not finding.blocking
    assert finding.title.startswith("Step time fell from") and "at iteration 220 (-2" in finding.title
    assert finding.fixes == []


def test_straggler_reports_after_the_jump_name_the_rank(tmp_path: Path):
    log = write_log(tmp_path / "training.log", Run(factor=1.3, straggler_from=160))
    (finding,) = step_findings(log)
    assert "name rank 5 the slowest" in finding.cause and "1.40x" in finding.cause
    assert any("MxRtt/Rnk" in e.text and "ms/5" in e.text for e in finding.evidence)
    assert "--log-straggler" not in {fix.flag for fix in finding.fixes}  # the run logs them already


def test_a_save_just_before_the_jump_is_named(tmp_path: Path):
    log = write_log(tmp_path / "training.log", Run(factor=1.3, at=301, save_interval=300))
    (finding,) = step_findings(log)
    assert "a checkpoint save at iteration 300, just before the change" in finding.cause


@pytest.mark.parametrize("run", [
    Run(jitter=0.02, seed=1), Run(jitter=0.05, seed=2), Run(jitter=0.05, seed=3, iterations=2000),
    Run(jitter=0.05, seed=4, iterations=60),
    # a save every 50 iterations whose interval holds the save (older Megatron): one slow logged step each time
    Run(jitter=0.03, save_interval=50, save_spike=20.0, seed=5),
    # ... or an asynchronous save's writer slowing the next step by a third
    Run(jitter=0.04, save_interval=10, save_spike=1.35, seed=6),
    # a slow start: compilation, NCCL set-up, the first batches off a cold filesystem
    Run(jitter=0.03, startup=(9.0, 3.0, 2.0, 1.6, 1.4, 1.3, 1.2, 1.15, 1.1, 1.05), iterations=120, seed=8),
    # --rampup-batch-size 32 32 ...: the step time grows with the batch, 32 -> 256 over 400 iterations (the trend rule
    # read it as a run 3.8x slower)
    Run(jitter=0.03, rampup=(32, 32, 50), iterations=600, seed=9),
    Run(jitter=0.05, rampup=(64, 64, 100), iterations=700, log_interval=10, seed=10),
], ids=["jitter2", "jitter5", "jitter5-long", "jitter5-short", "save-in-step", "async-save", "startup", "rampup",
        "rampup-interval10"])
def test_noise_saves_startup_and_batch_rampup_are_no_change(tmp_path: Path, run: Run):
    log = write_log(tmp_path / "training.log", run)
    assert step_findings(log) == []


def test_a_steady_trend_is_not_a_jump():
    rng = random.Random(3)
    for points in (40, 120, 600):
        drift = [1000 * (1 + 0.8 * i / points) * (1 + rng.gauss(0, 0.03)) for i in range(points)]
        assert find_step_change(drift) is None


def test_a_slowdown_that_came_back_is_not_a_lasting_change():
    rng = random.Random(4)
    values = [1000 * (1.4 if 100 <= i < 160 else 1.0) * (1 + rng.gauss(0, 0.02)) for i in range(300)]
    assert find_step_change(values) is None


def test_a_slowdown_after_the_batch_rampup_is_still_a_trend(tmp_path: Path):
    """The ramp-up's own growth is left out of the trend, a drift once the batch is full is not."""
    path = write_log(tmp_path / "training.log", Run(jitter=0.02, rampup=(128, 128, 40), iterations=400, seed=11))
    lines = path.read_text().splitlines()
    drifting = []
    for line in lines:  # +60 % from iteration 100 to 400, at the full batch of 256
        if "elapsed time per iteration (ms): " in line and (it := int(line.split("iteration")[1].split("/")[0])) > 100:
            head, rest = line.split("elapsed time per iteration (ms): ")
            value, tail = rest.split(" |", 1)
            line = f"{head}elapsed time per iteration (ms): {float(value) * (1 + 0.6 * (it - 100) / 300):.1f} |{tail}"
        drifting.append(line)
    path.write_text("\n".join(drifting) + "\n")
    (finding,) = step_findings(path)
    assert finding.title.startswith("Step time rose 1.") and "on the fitted trend" in finding.title


def test_straggler_reports_in_another_nodes_file_are_the_latest_not_after_the_change(tmp_path: Path):
    """A multi-node job: rank 0's reports in node 0's log, the iteration lines in the last node's; a report there
    has no place beside the change, so the finding does not claim it came after it."""
    merged = write_log(tmp_path / "merged.log", Run(factor=1.3, straggler_from=160)).read_text().splitlines()
    for node, keep in ((0, lambda line: not line.startswith("[rank15]")), (1, lambda line: line.startswith("[rank1")),):
        (tmp_path / f"out-node{node}").mkdir()
        (tmp_path / f"out-node{node}" / "training.log").write_text("\n".join(filter(keep, merged)) + "\n")
    (tmp_path / "merged.log").unlink()
    (finding,) = step_findings(tmp_path)
    assert "Megatron's latest --log-straggler reports name rank 5 the slowest" in finding.cause
    assert "after the change" not in finding.cause.split("(1)")[1].split("(2)")[0]
