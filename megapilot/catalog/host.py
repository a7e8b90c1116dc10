"""This machine's CPU as a device the estimator knows: peak rates measured on it, cached per machine.

The embedded trainer runs Megatron-Core on CPU processes (gloo, fp32 compute). To predict those runs the estimator
needs the CPU's rates the way it needs a GPU's datasheet: a dense matmul rate (its "tensor peak"), a memory
bandwidth (its "HBM"), and what gloo moves between local ranks. They are measured here, not looked up:

    matmul      the best of a few fp32 matmuls of 512 x 512 on one thread (torch, the library the trainer
                computes with)
    memory      the best of a few copies of a 64 MiB array (read + write, bytes counted once each way)
    ops         the best of a few forward + backward passes of the trainer's own model on tensors too small to
                hold work, one thread (`trainer.op_probe`, a process of its own): its time over the ATen ops it
                runs (counted) is what one op costs the rank's thread beyond its work (`GPUSpec.host_op_s`). On a
                CPU every op runs in line with the Python that issues it, so a small model's step is paced by its
                op count as much as by its FLOPs (`estimate.host_ops` holds the trainer's counts)
    elements    the same model at a working size: the time inside its element-wise kernels at two micro-batch
                sizes (their fixed costs cancel), over the elements the larger writes beyond the smaller
                (`GPUSpec.host_element_s`): one thread runs those per element, well below
                the memory's stream rate, so a CPU's element-wise work is priced by the elements the trainer's ops
                write (`estimate.host_ops`), not by the bytes a GPU's fused kernels move
    runtime     the probe process's peak resident memory with the tiny model trained: Python, torch and
                Megatron-Core, a rank's memory overhead in place of a GPU's CUDA context (`GPUSpec.host_runtime_gib`;
                kept at the larger of two measurements, as what a run will hold)
    gloo        collectives between ranks of one machine go through shared memory over loopback: modelled
                as memory-bandwidth-bound, each byte written and read by the sender and the receiver
                (GLOO_MEMORY_PASSES copies), so the link rate is memory bandwidth / GLOO_MEMORY_PASSES

A "GPU" here is one rank, and each rank computes on one thread: megapilot's launch environment exports
OMP_NUM_THREADS=1 for every launch (`launch.environment`; torchrun's default for several local ranks too), a lone
rank's included, so each runs at the one-thread rate, a share of it where ranks outnumber cores
(`host_cpu(ranks_per_node=...)`). Priced at every core's rate, two ranks on two cores, and a lone rank, had their
matmuls priced at twice the rate they run them.

The result is cached as JSON in the user's cache folder, one file per machine (hostname and CPU model), measured
again once it is an hour old. The cache keeps the last KEPT_MEASUREMENTS measurements and prices each rate at their
upper median: one taken on a busy machine is outvoted (of two, the better is kept), and so is one taken in a lucky
quiet second. Keeping the best ever measured instead ratcheted every rate up over days to what no run sees: on this
2-core machine one op at 10.3 us where typical measurements read 12-14, and every first prediction of
`bench/trainer_cpu/first_prediction.md` 20-38 % fast. `megapilot gpus --measure-host` measures again and replaces
them all. torch and numpy come with the `train` extra (the
only place CPU runs happen); without them the CPU is not listed.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

from megapilot.errors import MegapilotError
from megapilot.spec.hardware import GPUSpec

HOST_ALIAS = "cpu"
HOST_NAMES = ("cpu", "host", "host-cpu")
CACHE_ENV = "MEGAPILOT_HOST_CACHE"  # a folder instead of the user's cache folder (tests)
MATMUL_N = 512
MATMUL_REPEATS = 5
COPY_MIB = 64
COPY_REPEATS = 5
REFRESH_S = 3600.0  # a cached measurement older than this is taken again (and kept with the ones before it)
KEPT_MEASUREMENTS = 5
GLOO_MEMORY_PASSES = 4.0
HOST_LINK_GBPS = 1000.0  # activations "offloaded to host memory" already are in host memory: never the limit


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def cache_path() -> Path:
    """This machine's cache file (hostname and CPU model in its name: a shared home folder holds several)."""
    # start-up: platformdirs (9 ms) only where the cache path is needed
    import platformdirs

    folder = Path(os.environ.get(CACHE_ENV) or platformdirs.user_cache_dir("megapilot"))
    machine = hashlib.sha256(f"{platform.node()}|{_cpu_model()}|{_cores()}".encode()).hexdigest()[:12]
    return folder / f"host-cpu-{machine}.json"


OP_PROBE_KEYS = ("ops_per_s", "elements_per_s", "runtime_gib")  # what `trainer.op_probe` reports
RATE_KEYS = ("matmul_tflops_one_thread", "memory_tbps", *OP_PROBE_KEYS)
OP_PROBE_TIMEOUT_S = 300.0


def probe() -> dict[str, float]:
    """Measure the one-thread matmul rate (TFLOP/s), the memory bandwidth (TB/s), and the ops and element-wise
    elements a second one thread runs of this machine now (several seconds)."""
    try:
        # optional and heavy: numpy and torch (train extra) only to measure this machine
        import numpy as np
        import torch
    except ImportError:
        raise MegapilotError("measuring this machine's CPU needs numpy and torch", field="gpu",
                             fix="install the train extra (pip install 'megapilot[train]')") from None
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(MATMUL_N, MATMUL_N, generator=generator)
    b = torch.randn(MATMUL_N, MATMUL_N, generator=generator)
    threads = torch.get_num_threads()
    rates: dict[str, float] = {}
    try:
        torch.set_num_threads(1)
        a @ b  # first call: the thread pool starts
        best_s = min(_timed(lambda: a @ b) for _ in range(MATMUL_REPEATS))
        rates["matmul_tflops_one_thread"] = 2 * MATMUL_N**3 / best_s / 1e12
    finally:
        torch.set_num_threads(threads)
    source = np.ones(COPY_MIB * 1024 * 1024 // 8)
    target = np.empty_like(source)
    np.copyto(target, source)
    best_copy_s = min(_timed(lambda: np.copyto(target, source)) for _ in range(COPY_REPEATS))
    return rates | {"memory_tbps": 2 * source.nbytes / best_copy_s / 1e12} | _op_rates()


def _op_rates() -> dict[str, float]:
    """ATen ops, and elements of element-wise work, a second one thread runs through the trainer's own model
    (`trainer.op_probe`, in a process of its own: it makes a process group and patches torch for the CPU)."""
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    try:
        done = subprocess.run([sys.executable, "-m", "megapilot.trainer.op_probe"], capture_output=True, text=True,
                              env=env, timeout=OP_PROBE_TIMEOUT_S)
    except (subprocess.TimeoutExpired, OSError) as exc:
        raise _op_probe_failed(str(exc)) from None
    try:
        measured = json.loads(done.stdout.strip().splitlines()[-1])
        return {key: float(measured[key]) for key in OP_PROBE_KEYS}
    except (ValueError, KeyError, IndexError, TypeError):
        raise _op_probe_failed((done.stderr.strip().splitlines() or ["no output"])[-1]) from None


def _op_probe_failed(why: str) -> MegapilotError:
    return MegapilotError(f"measuring one op's cost on this machine's CPU failed ({why})", field="gpu",
                          fix="install the train extra (pip install 'megapilot[train]'), or run "
                              "`python -m megapilot.trainer.op_probe` to see the error")


def _timed(work: object) -> float:
    started = time.perf_counter()
    work()  # type: ignore[operator]  # a thunk
    return max(time.perf_counter() - started, 1e-9)


def _memory_gib() -> float:
    # start-up: psutil (about 60 ms) only to read this machine's memory
    import psutil

    return float(psutil.virtual_memory().total) / 2**30


def rank_matmul_tflops(rates: dict[str, float], cores: int, ranks_per_node: int | None) -> float:
    """What one rank's matmuls run at: one thread (megapilot's OMP_NUM_THREADS=1, a lone rank's too), shared where
    ranks outnumber cores. None: as many ranks as cores at most (`gpus` and `estimate` ask without a count)."""
    return rates["matmul_tflops_one_thread"] * min(1.0, cores / (ranks_per_node or 1))


def rank_op_s(rates: dict[str, float], cores: int, ranks_per_node: int | None, key: str = "ops_per_s") -> float:
    """What one op (`key`: or one element of element-wise work) costs a rank's thread: the measured one-thread
    cost, stretched where ranks outnumber cores."""
    return max(1.0, (ranks_per_node or 1) / cores) / rates[key]


def host_spec(rates: dict[str, float], ranks_per_node: int | None = None) -> GPUSpec:
    """The CPU as a GPUSpec from its measured rates: one "GPU" per local rank (at the rate `ranks_per_node` ranks
    each get), all of them in one scale-up domain."""
    memory_tbps = rates["memory_tbps"]
    gloo_gbps = memory_tbps * 1000 / GLOO_MEMORY_PASSES
    cores = _cores()
    return GPUSpec(
        name=f"CPU ({_cpu_model()}, {cores} cores)", alias=HOST_ALIAS, vendor="CPU", architecture="cpu",
        bf16_dense_tflops=rank_matmul_tflops(rates, cores, ranks_per_node), hbm_gib=_memory_gib(),
        hbm_bw_tbps=memory_tbps,
        scaleup_domain_gpus=max(cores, 1), gpus_per_node=max(cores, 1), scaleup_bw_gbps=gloo_gbps,
        scaleout_bw_gbps=gloo_gbps, host_link_gbps=HOST_LINK_GBPS,
        host_op_s=rank_op_s(rates, cores, ranks_per_node),
        host_element_s=rank_op_s(rates, cores, ranks_per_node, "elements_per_s"),
        host_runtime_gib=rates["runtime_gib"],
        source=f"measured on this machine: fp32 matmul {MATMUL_N}^3 (torch, one thread per rank), a {COPY_MIB} MiB "
               f"copy, one op's and one element-wise element's cost (the trainer's model, one thread); gloo between "
               f"local ranks modelled as memory-bandwidth-bound (/{GLOO_MEMORY_PASSES:g})",
    )


def host_cpu(*, remeasure: bool = False, ranks_per_node: int | None = None) -> GPUSpec:
    """This machine's CPU as each of `ranks_per_node` local ranks sees it (None: several): from the cache, measured
    again once it is older than REFRESH_S (and cached); `remeasure` measures again and replaces what was cached.

    Other work on the machine makes a measurement low, a quiet moment high: an automatic measurement joins the
    ones before it and each rate is their upper median (`typical_rates`), so one taken on a busy machine heals on
    the next one."""
    path = cache_path()
    if remeasure:
        _host_rates.cache_clear()
        measurements = [_host_rates()]
    else:
        cache = _read_cache(path)
        cached, measured_at = _rates_in(cache)
        if cached is not None and time.time() - measured_at < REFRESH_S:
            return host_spec(cached, ranks_per_node)
        measurements = [*_kept_measurements(cache, cached), _host_rates()][-KEPT_MEASUREMENTS:]
    rates = typical_rates(measurements)
    _write(path, rates, measurements)
    return host_spec(rates, ranks_per_node)


def typical_rates(measurements: list[dict[str, float]]) -> dict[str, float]:
    """Each rate at the upper median of the measurements (of two, the better); the runtime's memory at the largest
    (what a run will hold)."""
    return {key: max(m[key] for m in measurements) if key == "runtime_gib"
            else statistics.median_high(m[key] for m in measurements) for key in RATE_KEYS}


@lru_cache(maxsize=1)
def _host_rates() -> dict[str, float]:
    """One measurement per process."""
    return probe()


def _cached_rates(path: Path) -> tuple[dict[str, float] | None, float]:
    """The cached rates and when they were measured (`_rates_in`)."""
    return _rates_in(_read_cache(path))


def _read_cache(path: Path) -> Any:
    """The cache file's JSON, None where it cannot be read (missing, unreadable, not JSON)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _rates_in(cache: Any) -> tuple[dict[str, float] | None, float]:
    """The cached rates and when they were measured (0: unknown, so measured again; a file without every rate,
    written before one was measured, is measured again)."""
    try:
        rates = {key: float(cache[key]) for key in RATE_KEYS}
        measured_at = float(cache.get("measured_at") or 0.0)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None, 0.0
    return (rates, measured_at) if all(v > 0 for v in rates.values()) else (None, 0.0)


def _kept_measurements(cache: Any, cached: dict[str, float] | None) -> list[dict[str, float]]:
    """The measurements the cache keeps; a cache written before it kept them holds its rates as one."""
    try:
        return [{key: float(m[key]) for key in RATE_KEYS} for m in cache["measurements"]]
    except (ValueError, KeyError, TypeError, AttributeError):
        return [] if cached is None else [cached]


def _write(path: Path, rates: dict[str, float], measurements: list[dict[str, float]]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(rates | {"measured_at": time.time(), "cpu": _cpu_model(),
                                            "measurements": measurements}) + "\n", encoding="utf-8")
    except OSError:
        pass  # an unwritable cache only means measuring again next time


def is_host_name(name: str) -> bool:
    return name.strip().lower() in HOST_NAMES


__all__ = ["HOST_ALIAS", "cache_path", "host_cpu", "host_spec", "is_host_name", "probe"]
