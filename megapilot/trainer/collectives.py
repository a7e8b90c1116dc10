"""A collective-bandwidth probe for nodes without nccl-tests: `torchrun ... -m megapilot.trainer.collectives`.

It sweeps message sizes for all-reduce, all-gather, reduce-scatter and all-to-all over every rank, with NCCL/RCCL on
GPUs and gloo on CPUs, and prints nccl-tests' table (`megapilot.logs.collectives` reads both). Then, so that a short
collective can be blamed on a node, it runs each node's own ranks as a group (the intra-node figure of every node)
and, with several nodes, a send/recv between the first rank of every pair of nodes: the slow node is the one whose
own group, or every pair it is in, falls short.

Timing follows nccl-tests: a barrier, `warmup` untimed calls, then `iters` timed calls; a rank's time is the mean
per call and the row's time is the slowest rank's (a collective is done when its last rank is).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from megapilot.logs.collectives import (
    CollectiveSample,
    bus_bandwidth_gbps,
    format_average,
    format_header,
    format_row,
)

PROBED = ("all_reduce", "all_gather", "reduce_scatter", "alltoall")
FLOAT_BYTES = 4


def _size(text: str) -> int:
    """`64K`, `4M`, `1G` or a plain byte count."""
    units = {"K": 1024, "M": 1024**2, "G": 1024**3}
    text = text.strip().upper()
    try:
        return int(float(text[:-1]) * units[text[-1]]) if text and text[-1] in units else int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (write e.g. 1024, 64K, 4M)") from exc


def _options(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="megapilot.trainer.collectives", description=__doc__.splitlines()[0])
    parser.add_argument("--collectives", default=",".join(PROBED),
                        help=f"comma-separated, from {', '.join(PROBED)}")
    parser.add_argument("-b", "--min-bytes", type=_size, default=_size("4K"))
    parser.add_argument("-e", "--max-bytes", type=_size, default=_size("4M"))
    parser.add_argument("-f", "--step-factor", type=int, default=4)
    parser.add_argument("-n", "--iters", type=int, default=10)
    parser.add_argument("-w", "--warmup", type=int, default=2)
    parser.add_argument("--no-per-node", action="store_true", help="skip the per-node and node-pair probes")
    options = parser.parse_args(argv)
    unknown = set(options.collectives.split(",")) - set(PROBED)
    if unknown:
        parser.error(f"--collectives: unknown {', '.join(sorted(unknown))}; choose from {', '.join(PROBED)}")
    if options.min_bytes < 64 or options.max_bytes < options.min_bytes or options.step_factor < 2:
        parser.error("sizes: need 64 <= --min-bytes <= --max-bytes and --step-factor >= 2")
    return options


def _sizes(options: argparse.Namespace, ranks: int) -> list[int]:
    """Message sizes, each a whole number of floats per rank (nccl-tests rounds the same way)."""
    sizes, size = [], options.min_bytes
    while size <= options.max_bytes:
        per_rank = max(1, size // (FLOAT_BYTES * ranks))
        sizes.append(per_rank * FLOAT_BYTES * ranks)
        size *= options.step_factor
    return sorted(set(sizes))


def _operation(collective: str, size_bytes: int, ranks: int, group: dist.ProcessGroup | None,
               device: torch.device) -> Callable[[], object]:
    """One call of `collective` on a `size_bytes` buffer (nccl-tests' size: the whole buffer a rank ends with for
    all-gather, the whole buffer it starts with for reduce-scatter)."""
    elements = size_bytes // FLOAT_BYTES
    full = torch.ones(elements, dtype=torch.float32, device=device)
    part = torch.ones(elements // ranks, dtype=torch.float32, device=device)
    if collective == "all_reduce":
        return lambda: dist.all_reduce(full, group=group)
    if collective == "all_gather":
        return lambda: dist.all_gather_into_tensor(full, part, group=group)
    if collective == "reduce_scatter":
        return lambda: dist.reduce_scatter_tensor(part, full, group=group)
    out = torch.empty_like(full)
    return lambda: dist.all_to_all_single(out, full, group=group)


def _timed(call: Callable[[], object], options: argparse.Namespace, group: dist.ProcessGroup | None,
           device: torch.device) -> float:
    """The slowest rank's mean seconds per call."""
    for _ in range(options.warmup):
        call()
    _synchronize(device)
    dist.barrier(group=group)
    started = time.perf_counter()
    for _ in range(options.iters):
        call()
    _synchronize(device)
    mean = torch.tensor([(time.perf_counter() - started) / options.iters], dtype=torch.float64)
    dist.all_reduce(mean, op=dist.ReduceOp.MAX, group=group)
    return float(mean.item())


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _sweep(scope: str, collectives: list[str], sizes: list[int], ranks: int, nodes: int,
           group: dist.ProcessGroup | None, options: argparse.Namespace, device: torch.device,
           printing: bool) -> None:
    for collective in collectives:
        if printing:
            _print(*format_header(collective, ranks, nodes, scope))
        busbw_sum = 0.0
        for size in sizes:
            time_s = _timed(_operation(collective, size, ranks, group, device), options, group, device)
            algbw, busbw = bus_bandwidth_gbps(collective, size, time_s, ranks)
            busbw_sum += busbw
            if printing:
                sample = CollectiveSample(collective, size, time_s * 1e6, algbw, busbw, 0, ranks, 0)
                _print(format_row(sample, size // FLOAT_BYTES, redop="sum" if "reduce" in collective else "none"))
        if printing:
            _print(format_average(busbw_sum / len(sizes)))


def _print(*lines: str) -> None:
    sys.stdout.write("".join(line + "\n" for line in lines))
    sys.stdout.flush()


def _node_of_every_rank(world: int) -> list[int]:
    """torchrun's node rank (GROUP_RANK) of every rank: hosts on one machine share a hostname, not a node rank."""
    mine = torch.tensor([int(os.environ.get("GROUP_RANK", "0"))], dtype=torch.int64)
    gathered = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(gathered, mine)
    return [int(t.item()) for t in gathered]


def _per_node(options: argparse.Namespace, sizes: list[int], device: torch.device) -> None:
    """Each node's ranks alone (`all_reduce@node1`), then send/recv between the first ranks of each node pair
    (`sendrecv@node0-node1`). Every rank joins every `new_group` call, as torch.distributed requires."""
    rank, world = dist.get_rank(), dist.get_world_size()
    node_of = _node_of_every_rank(world)
    nodes = sorted(set(node_of))
    largest = [sizes[-1]]
    for node in nodes:
        members = [r for r, n in enumerate(node_of) if n == node]
        group = dist.new_group(members)
        if rank in members and len(members) > 1:
            _sweep(f"node{node}", ["all_reduce"], largest, len(members), 1, group, options, device,
                   printing=rank == members[0])
        dist.barrier()
    firsts = {node: node_of.index(node) for node in nodes}
    for i, left in enumerate(nodes):
        for right in nodes[i + 1:]:
            pair = [firsts[left], firsts[right]]
            group = dist.new_group(pair)
            if rank in pair:
                _pair_sendrecv(f"node{left}-node{right}", pair, largest[0], group, options, device,
                               printing=rank == pair[0])
            dist.barrier()


def _pair_sendrecv(scope: str, pair: list[int], size: int, group: dist.ProcessGroup,
                   options: argparse.Namespace, device: torch.device, printing: bool) -> None:
    buffer = torch.ones(size // FLOAT_BYTES, dtype=torch.float32, device=device)
    peer = pair[1] if dist.get_rank() == pair[0] else pair[0]
    sending = dist.get_rank() == pair[0]

    def exchange() -> None:
        # one message each way, as nccl-tests' sendrecv does around a ring of two
        if sending:
            dist.send(buffer, peer)
            dist.recv(buffer, peer)
        else:
            dist.recv(buffer, peer)
            dist.send(buffer, peer)

    time_s = _timed(exchange, options, group, device) / 2
    algbw, busbw = bus_bandwidth_gbps("sendrecv", size, time_s, 2)
    if printing:
        _print(*format_header("sendrecv", 2, 2, scope))
        _print(format_row(CollectiveSample("sendrecv", size, time_s * 1e6, algbw, busbw, 0, 2, 0),
                          size // FLOAT_BYTES, redop="none"))
        _print(format_average(busbw))


def main(argv: list[str] | None = None) -> int:
    options = _options(argv)
    on_gpu = torch.cuda.is_available()
    if on_gpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if on_gpu else "gloo")
    try:
        device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
        world = dist.get_world_size()
        nodes = len(set(_node_of_every_rank(world)))
        sizes = _sizes(options, world)
        if dist.get_rank() == 0:
            _print(f"# megapilot collectives probe: backend {dist.get_backend()}  ranks {world}  nodes {nodes}  "
                   f"iters {options.iters}  warmup {options.warmup}")
        _sweep("", options.collectives.split(","), sizes, world, nodes, None, options, device,
               printing=dist.get_rank() == 0)
        if not options.no_per_node and world > 1:
            _per_node(options, _sizes(options, 2), device)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
