"""Suite overhead: wall time of a suite run that is not the training processes' own time.

Runs the packaged `tiny-local` suite (smoke, checkpoint save + resume, 2 combos: 5 training jobs of
the embedded Megatron-Core trainer on CPU) through `megapilot suite run`, then reads `suite.json`:

    per job      overhead = the combo's wall time in the lifecycle (render, submit, poll, log scan,
                 measurement, gates, stray check) - the job's own duration (launch to exit, from the executor)
    whole run    overhead = the suite's wall time - the sum of its jobs' durations (stages without a job,
                 result writing, report, history, and the CLI's start included)

Goal: <= 2 s per combo. CVS's fixed sleeps alone cost >= 160 s per cell (50 s after launch, 80 s before
the first poll, 30 s at completion; reference/cvs_megatron_suite.md §1.4-1.5), before its 120 s polls.

    .venv/bin/python bench/suite_overhead/run.py        # writes results.json and results.md here
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOAL_S = 2.0
CVS_FIXED_SLEEPS_S = 160.0


def run_suite(workdir: Path) -> tuple[dict, float]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    megapilot = [sys.executable, "-m", "megapilot.cli.app"]
    subprocess.run([*megapilot, "suite", "init", "tiny-local", "-o", str(workdir / "suite.json")], check=True,
                   capture_output=True, env=env)
    clock = time.monotonic()
    done = subprocess.run([*megapilot, "suite", "run", str(workdir / "suite.json"), "--out", str(workdir / "runs"),
                           "--json", "--no-history"], capture_output=True, text=True, env=env, check=False)
    wall_s = time.monotonic() - clock
    if done.returncode != 0:
        raise SystemExit(f"suite failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    run_dir = Path(json.loads(done.stdout)["run_dir"])
    suite = json.loads((run_dir / "suite.json").read_text())
    # Every training job's own duration, the checkpoint stage's save and resume runs included.
    suite["job_durations_s"] = {record.parent.name: json.loads(record.read_text())["status"]["elapsed_s"]
                                for record in run_dir.glob("*/job.json")}
    return suite, wall_s


def overheads(suite: dict, cli_wall_s: float) -> dict:
    jobs = []
    for combo in suite["combos"]:
        if combo.get("job") is None:
            continue
        jobs.append({"combo": combo["key"], "wall_s": combo["duration_s"], "job_s": combo["job"]["duration_s"],
                     "overhead_s": round(combo["duration_s"] - combo["job"]["duration_s"], 3)})
    checkpoint = next(s for s in suite["stages"] if s["name"] == "checkpoint")
    durations = suite["job_durations_s"]
    checkpoint_jobs_s = durations.get("checkpoint-save", 0.0) + durations.get("checkpoint-resume", 0.0)
    job_total = sum(durations.values())
    return {
        "jobs": jobs,
        "checkpoint_stage_s": checkpoint["duration_s"],
        "checkpoint_jobs_s": round(checkpoint_jobs_s, 3),
        "checkpoint_overhead_s": round(checkpoint["duration_s"] - checkpoint_jobs_s, 3),
        "suite_wall_s": suite["duration_s"],
        "cli_wall_s": round(cli_wall_s, 3),
        "training_jobs_s": round(job_total, 3),
        "suite_overhead_s": round(suite["duration_s"] - job_total, 3),
        "cli_overhead_s": round(cli_wall_s - job_total, 3),
    }


def write(results: dict) -> None:
    (HERE / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    worst = max(j["overhead_s"] for j in results["jobs"])
    lines = [
        "# Suite overhead (tiny-local: smoke, checkpoint save + resume, 2 combos)",
        "",
        f"Machine: {results['machine']}. Same script, one run. Goal: <= {GOAL_S:g} s per combo; "
        f"CVS's fixed sleeps: >= {CVS_FIXED_SLEEPS_S:g} s per cell.",
        "",
        "| combo | wall in the lifecycle (s) | training job (s) | overhead (s) |",
        "|---|---:|---:|---:|",
        *[f"| {j['combo']} | {j['wall_s']:.2f} | {j['job_s']:.2f} | {j['overhead_s']:.3f} |" for j in results["jobs"]],
        "",
        f"Worst per-combo overhead: {worst:.3f} s ({'goal met' if worst <= GOAL_S else 'goal NOT met'}). "
        f"Checkpoint stage (save + resume jobs, continuity checks): {results['checkpoint_stage_s']:.2f} s, of it "
        f"{results['checkpoint_jobs_s']:.2f} s training, {results['checkpoint_overhead_s']:.3f} s overhead.",
        "",
        f"Whole suite: {results['suite_wall_s']:.2f} s inside the lifecycle, {results['training_jobs_s']:.2f} s of it "
        f"training jobs, {results['suite_overhead_s']:.2f} s overhead for all stages together (preflight probe, "
        f"checkpoint checks, gates, stray checks); the CLI end to end took {results['cli_wall_s']:.2f} s "
        f"({results['cli_overhead_s']:.2f} s besides training, report and interpreter start included).",
        "",
        "A job's duration is measured by the executor from its launch to its exit, so the trainer's own",
        "start-up (imports, process group, model build) counts as training time, not overhead.",
    ]
    (HERE / "results.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="mp-bench-suite-") as tmp:
        suite, cli_wall_s = run_suite(Path(tmp))
    results = overheads(suite, cli_wall_s)
    results["machine"] = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    write(results)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
