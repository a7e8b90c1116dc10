"""A real torch.distributed (gloo) job for the executor's end-to-end tests.

Every rank all-reduces a tensor each iteration; the last rank prints Megatron-format iteration
lines with real timestamps. `--stall-rank R --stall-after K` makes rank R stop answering after
iteration K, so the others block inside all_reduce: a genuine distributed hang.
"""

import argparse
import os
import time
from datetime import datetime

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--iters", type=int, default=6)
parser.add_argument("--interval-s", type=float, default=0.2)
parser.add_argument("--stall-rank", type=int)
parser.add_argument("--stall-after", type=int)
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
print(f"rank {rank}/{world} pid {os.getpid()} MASTER_PORT={os.environ['MASTER_PORT']}", flush=True)
for iteration in range(1, args.iters + 1):
    started = time.perf_counter()
    total = torch.ones(8) * (rank + 1)
    dist.all_reduce(total)
    assert total[0].item() == world * (world + 1) / 2
    time.sleep(args.interval_s)
    elapsed_ms = (time.perf_counter() - started) * 1000
    if rank == world - 1:
        stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S.%f")
        print(f" [{stamp}] iteration {iteration:8d}/{args.iters:8d} | consumed samples: {iteration * world:12d} | "
              f"elapsed time per iteration (ms): {elapsed_ms:.1f} | lm loss: {1.0 / iteration:.6E} |", flush=True)
    if rank == args.stall_rank and iteration == args.stall_after:
        while True:
            time.sleep(60)
dist.destroy_process_group()
