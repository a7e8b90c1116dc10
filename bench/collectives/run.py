"""Bus bandwidth of megapilot's torch.distributed probe with gloo on this machine, beside the expected-bandwidth
table the collectives stage gates GPU runs against.

Two "nodes" on this machine: two torchrun processes (`--nnodes 2 --nproc-per-node 1`, static rendezvous on
loopback), one rank each, so every collective crosses the two nodes' processes over loopback TCP. Each run sweeps
all-reduce, all-gather, reduce-scatter and all-to-all from 1 KiB to 4 MiB (doubling), 20 timed calls after 5
warm-up calls per size (nccl-tests' timing: the slowest rank's mean per call), then the send/recv of the node pair.
The sweep is repeated and each figure is the median of the repeats, with the spread.

These are gloo figures on a 2-core CPU shared with other work: they test the machinery, they are no GPU figure,
and the stage never gates a CPU run on them. The expected table is computed by the stage's own rule
(`megapilot.suite.collectives.links_for`) from the GPU catalog.

    .venv/bin/python bench/collectives/run.py [--repeats 3]   # writes results.json and results.md beside it
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from megapilot.catalog.gpus import get_gpu
from megapilot.execute.process import free_port
from megapilot.logs.collectives import parse_collectives
from megapilot.suite.collectives import links_for
from megapilot.suite.config import CollectivesConfig

HERE = Path(__file__).parent
OPS = ("all_reduce", "all_gather", "reduce_scatter", "alltoall")
MIN_BYTES, MAX_BYTES, ITERS, WARMUP = 1024, 4 * 2**20, 20, 5
GPUS = ("h100", "h200", "b200", "gb200", "mi300x", "mi325x", "mi355x")


def one_sweep(workdir: Path) -> dict[str, dict[int, float]]:
    """Both nodes' torchrun to completion; busbw (GB/s) by collective (and `sendrecv@node0-node1`) and size."""
    port = free_port()
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    argv = ["-m", "megapilot.trainer.collectives", "--collectives", ",".join(OPS), "-b", str(MIN_BYTES),
            "-e", str(MAX_BYTES), "-f", "2", "-n", str(ITERS), "-w", str(WARMUP)]
    logs = [workdir / f"node{k}.log" for k in range(2)]
    processes = []
    for k in range(2):
        with logs[k].open("w") as log:
            processes.append(subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(k),
                 "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port), *argv],
                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=workdir))
    codes = [p.wait(timeout=900) for p in processes]
    if codes != [0, 0]:
        raise SystemExit("\n".join(log.read_text()[-2000:] for log in logs))
    figures: dict[str, dict[int, float]] = {}
    for log in logs:
        for run in parse_collectives(log.read_text().splitlines()):
            name = f"{run.collective}@{run.scope}" if run.scope else run.collective
            figures[name] = {s.size_bytes: s.busbw_gbps for s in run.samples}
    return figures


def expected_table() -> list[dict[str, object]]:
    """What each catalog GPU's links allow, and the stage's default floor (min_fraction of it)."""
    fraction = CollectivesConfig().min_fraction
    rows = []
    for alias in GPUS:
        gpu = get_gpu(alias)
        per_node = gpu.gpus_per_node
        cases = {"one node, all-reduce": links_for(gpu, "all_reduce", nodes=1, ranks_per_node=per_node),
                 "2 nodes, ring collectives": links_for(gpu, "all_reduce", nodes=2, ranks_per_node=per_node),
                 "2 nodes, all-to-all": links_for(gpu, "alltoall", nodes=2, ranks_per_node=per_node),
                 "node pair, send/recv": links_for(gpu, "sendrecv", nodes=2, ranks_per_node=1)}
        for case, links in cases.items():
            assert links.busbw_gbps is not None
            rows.append({"gpu": gpu.name, "case": case, "expected_busbw_gbps": round(links.busbw_gbps, 1),
                         "floor_gbps": round(fraction * links.busbw_gbps, 1), "links": links.name})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    options = parser.parse_args()
    sweeps = []
    with tempfile.TemporaryDirectory() as scratch:
        for repeat in range(options.repeats):
            workdir = Path(scratch) / f"repeat{repeat}"
            workdir.mkdir()
            sweeps.append(one_sweep(workdir))
    measured: dict[str, dict[str, dict[str, float]]] = {}
    for name in sweeps[0]:
        measured[name] = {}
        for size in sweeps[0][name]:
            values = [sweep[name][size] for sweep in sweeps]
            measured[name][str(size)] = {"median": round(statistics.median(values), 4),
                                         "min": round(min(values), 4), "max": round(max(values), 4)}
    results = {
        "what": "gloo bus bandwidth (GB/s), 2 ranks on 2 torchrun nodes of this machine over loopback",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "sweep": {"ops": list(OPS), "min_bytes": MIN_BYTES, "max_bytes": MAX_BYTES, "iters": ITERS,
                  "warmup": WARMUP, "repeats": options.repeats},
        "measured": measured,
        "expected_gpu": expected_table(),
    }
    (HERE / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (HERE / "results.md").write_text(markdown(results))
    print((HERE / "results.md").read_text())


def markdown(results: dict) -> str:
    measured = results["measured"]
    sizes = sorted({int(size) for figures in measured.values() for size in figures})
    names = [name for name in measured if "@" not in name]
    sweep = results["sweep"]
    lines = [
        "# Collective bus bandwidth: the gloo probe on this machine",
        "",
        f"{results['what']}; {results['machine']['cpus']} CPU cores ({results['machine']['platform']}), shared "
        "with other work. **gloo on a 2-core CPU, not a GPU figure**: it shows the probe and the stage work, and "
        "the stage records CPU rows without gating them.",
        "",
        f"Sweep: {', '.join(sweep['ops'])}; {sweep['min_bytes']} B to {sweep['max_bytes']} B doubling, "
        f"{sweep['iters']} timed calls after {sweep['warmup']} warm-up calls per size (the slowest rank's mean); "
        f"median of {sweep['repeats']} repeats, [min-max] beside it. Written by `bench/collectives/run.py`.",
        "",
        "| size | " + " | ".join(names) + " |",
        "|---:|" + "---:|" * len(names),
    ]
    for size in sizes:
        cells = []
        for name in names:
            figure = measured[name].get(str(size))
            cells.append(f"{figure['median']:.3f} [{figure['min']:.3f}-{figure['max']:.3f}]" if figure else "-")
        lines.append(f"| {size} | " + " | ".join(cells) + " |")
    lines += ["", "Peak (median) bus bandwidth, GB/s: " + ", ".join(
        f"{name} {max(f['median'] for f in measured[name].values()):.3f}" for name in names) + "."]
    pairs = [name for name in measured if "@" in name]
    for name in pairs:
        figure = next(iter(measured[name].values()))
        lines.append(f"Node pair `{name}` (send/recv of {next(iter(measured[name]))} B): {figure['median']:.3f} GB/s "
                     f"[{figure['min']:.3f}-{figure['max']:.3f}].")
    lines += ["", "## What a GPU run is gated against",
              "",
              "The stage's rule (`links_for`) on the GPU catalog's per-GPU, per-direction figures, and the default "
              "floor (`collectives.min_fraction` 0.7 of it). A CPU run has no row here: it is recorded, not gated.",
              "", "| GPU | case | expected busbw (GB/s) | floor (GB/s) | links |", "|---|---|---:|---:|---|"]
    for row in results["expected_gpu"]:
        lines.append(f"| {row['gpu']} | {row['case']} | {row['expected_busbw_gbps']:g} | {row['floor_gbps']:g} | "
                     f"{row['links']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
