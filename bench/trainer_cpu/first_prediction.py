"""The first prediction of a CPU run, before any run calibrates it: predicted against measured step time.

A CPU is the one device this repository can both predict and run. Before a run of it is in the history, the
estimate is the model's alone (`catalog.host` measures the CPU's matmul, memory and per-op rates; the step-time
model prices them). Each case here is planned with its layout pinned, its step predicted by the estimator with the
host's op and element costs (`estimate.host_ops`), with its op costs alone (`GPUSpec.host_element_s` = 0: the
element-wise work priced as a GPU's, by the bytes it moves) and with neither (`host_op_s` = 0 too), then trained
for real with `megapilot run --plan` (Megatron-Core on CPU, no history) and its per-iteration times read
from its log. Measured = the median of the iterations after the first two (the start-up ones), and their minimum
(the least disturbed by other work on the machine); error = predicted / measured - 1.

    .venv/bin/python bench/trainer_cpu/first_prediction.py   # writes first_prediction.json / .md beside it
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).parent
MEGAPILOT = Path(sys.executable).with_name("megapilot")
ITERS = 16
WARM_UP = 2

#: Megatron dimensions of two models beside the built-in tiny GPT: a wider GPT and a Llama-shaped layer
MODELS = {
    "gpt-wide": {"name": "gpt-wide", "num_layers": 4, "hidden_size": 256, "ffn_hidden_size": 1024,
                 "num_attention_heads": 8, "vocab_size": 1024, "max_position_embeddings": 256,
                 "mlp_activation": "gelu", "normalization": "LayerNorm", "position_embedding": "learned_absolute",
                 "tie_embeddings": True, "add_bias_linear": True},
    "llama-tiny": {"name": "llama-tiny", "num_layers": 4, "hidden_size": 128, "ffn_hidden_size": 352,
                   "num_attention_heads": 4, "num_query_groups": 2, "vocab_size": 1024,
                   "max_position_embeddings": 128, "mlp_activation": "swiglu", "normalization": "RMSNorm",
                   "position_embedding": "rope", "tie_embeddings": False, "add_bias_linear": False},
}


@dataclass(frozen=True)
class Case:
    name: str
    model: str
    ranks: int
    mbs: int
    gbs: int
    seq: int


CASES = (
    Case("demo combo MBS 1 (tiny, 2 ranks)", "tiny", 2, 1, 8, 128),
    Case("demo combo MBS 2 (tiny, 2 ranks)", "tiny", 2, 2, 8, 128),
    Case("tiny, 1 rank", "tiny", 1, 1, 4, 128),
    Case("gpt-wide, 2 ranks, seq 256", "gpt-wide", 2, 1, 8, 256),
    Case("llama-tiny, 2 ranks", "llama-tiny", 2, 1, 8, 128),
    Case("the README tour's MBS 8 (tiny, 2 ranks)", "tiny", 2, 8, 16, 128),
    Case("tiny, 2 ranks, MBS 4", "tiny", 2, 4, 16, 128),
)


def _model_arg(name: str, folder: Path) -> str:
    if name not in MODELS:
        return name
    path = folder / f"{name}.json"
    path.write_text(json.dumps(MODELS[name]), encoding="utf-8")
    return str(path)


def predicted_s(plan: Path) -> tuple[float, float, float, dict[str, float]]:
    """The saved plan's step predicted with the host's op and element costs, with its op costs alone, with
    neither; and this machine's rates."""
    from megapilot.catalog import host
    from megapilot.cli.common import load_plan_file
    from megapilot.estimate import estimate

    saved = load_plan_file(plan)

    def step_s(**gpu: float) -> float:
        cluster = saved.cluster.model_copy(update={"gpu": saved.cluster.gpu.model_copy(update=gpu)})
        return estimate(saved.model, cluster, saved.training, saved.parallel).step_time_s

    rates, _ = host._cached_rates(host.cache_path())
    return step_s(), step_s(host_element_s=0.0), step_s(host_element_s=0.0, host_op_s=0.0), rates or {}


def measured_s(run_dir: Path) -> tuple[float, float]:
    """Median and minimum of the iterations after the warm-up, from the run's log."""
    log = next(run_dir.rglob("training.log")).read_text(encoding="utf-8", errors="replace")
    times: dict[int, float] = {}
    for match in re.finditer(r"iteration\s+(\d+)/\s*\d+ .*?elapsed time per iteration \(ms\): ([\d.]+)", log):
        times[int(match.group(1))] = float(match.group(2)) / 1000
    steady = [t for i, t in sorted(times.items()) if i > WARM_UP]
    return statistics.median(steady), min(steady)


def run_case(case: Case, folder: Path) -> dict[str, object]:
    plan = folder / (re.sub(r"[^A-Za-z0-9._-]+", "_", case.name).strip("_") + ".json")
    subprocess.run([str(MEGAPILOT), "plan", "--model", _model_arg(case.model, folder), "--gpu", "cpu",
                    "--gpus", str(case.ranks), "--seq-len", str(case.seq), "--gbs", str(case.gbs),
                    "--mbs", str(case.mbs), "--tp", "1", "--pp", "1", "--recompute", "none", "--top", "1",
                    "--save", str(plan)], check=True, capture_output=True, text=True)
    with_both, ops_only, without, rates = predicted_s(plan)
    run_dir = folder / "runs"
    done = subprocess.run([str(MEGAPILOT), "run", "--plan", str(plan), "--device", "cpu", "--train-iters",
                           str(ITERS), "--no-history", "--run-dir", str(run_dir), "--combo", plan.stem],
                          capture_output=True, text=True, env=os.environ | {"OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        raise SystemExit(f"{case.name}: run failed\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    median, least = measured_s(run_dir / plan.stem)
    return {"case": case.name, "ranks": case.ranks, "mbs": case.mbs, "gbs": case.gbs, "seq": case.seq,
            "predicted_s": with_both, "predicted_ops_only_s": ops_only, "predicted_without_host_ops_s": without,
            "measured_median_s": median, "measured_min_s": least, "error_vs_median": with_both / median - 1,
            "error_vs_min": with_both / least - 1, "error_ops_only_vs_median": ops_only / median - 1,
            "error_without_host_ops_vs_median": without / median - 1,
            "ops_per_s": rates.get("ops_per_s"), "elements_per_s": rates.get("elements_per_s"),
            "load_average": os.getloadavg()[0]}


def write_markdown(rows: list[dict[str, object]]) -> None:
    from megapilot.catalog.host import _cpu_model

    ops_per_s = float(rows[0]["ops_per_s"] or 0)
    elements_per_s = float(rows[0]["elements_per_s"] or 0)
    lines = ["# The first prediction of a CPU run (no run calibrates it)", "",
             f"Generated by `bench/trainer_cpu/first_prediction.py` on {_cpu_model()} ({os.cpu_count()} cores), "
             f"{time.strftime('%Y-%m-%d')}; one op measured at {1e6 / ops_per_s:.1f} us and one element of "
             f"element-wise work at {1e9 / elements_per_s:.2f} ns (`trainer.op_probe`). Step times in ms; error = "
             f"predicted / measured - 1; measured = the median (and the minimum) of iterations {WARM_UP + 1}-{ITERS}; "
             "'ops only': the same estimate with the element-wise work priced as a GPU's, by its bytes "
             "(`GPUSpec.host_element_s` = 0, the previous model); 'neither': without the host's op cost too "
             "(`host_op_s` = 0, which also prices the attention core as a GPU's fused kernel). Load = the machine's "
             "load average when the case ended.", "",
             "| case | predicted | measured median (min) | error vs median | vs min | ops only: predicted, error | "
             "neither: predicted, error | load |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ms = {key: 1000 * float(r[key]) for key in ("predicted_s", "measured_median_s", "measured_min_s",
                                                    "predicted_ops_only_s", "predicted_without_host_ops_s")}
        pct = {key: 100 * float(r[key]) for key in ("error_vs_median", "error_vs_min", "error_ops_only_vs_median",
                                                    "error_without_host_ops_vs_median")}
        lines.append(f"| {r['case']} | {ms['predicted_s']:.1f} | {ms['measured_median_s']:.1f} "
                     f"({ms['measured_min_s']:.1f}) | {pct['error_vs_median']:+.0f} % | {pct['error_vs_min']:+.0f} % | "
                     f"{ms['predicted_ops_only_s']:.1f}, {pct['error_ops_only_vs_median']:+.0f} % | "
                     f"{ms['predicted_without_host_ops_s']:.1f}, {pct['error_without_host_ops_vs_median']:+.0f} % | "
                     f"{float(r['load_average']):.1f} |")
    (HERE / "first_prediction.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in CASES:
            rows.append(run_case(case, Path(tmp)))
            print(json.dumps(rows[-1]), flush=True)
    (HERE / "first_prediction.json").write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    write_markdown(rows)


if __name__ == "__main__":
    main()
