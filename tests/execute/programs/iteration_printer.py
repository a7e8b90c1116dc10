"""A small real program that behaves like a training job's log: Megatron-format iteration lines.

Options choose how it ends: normally, exiting early (with a code), stalling forever (a hang),
ignoring SIGTERM, or leaving child processes behind (optionally in a session of their own).
"""

import argparse
import os
import signal
import subprocess
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--iters", type=int, default=5)
parser.add_argument("--print-total", type=int, help="train_iters printed in the line (default --iters)")
parser.add_argument("--interval-s", type=float, default=0.05)
parser.add_argument("--log-interval", type=int, default=1)
parser.add_argument("--exit-after", type=int, help="exit after this iteration")
parser.add_argument("--exit-code", type=int, default=0)
parser.add_argument("--stall-after", type=int, help="sleep forever after this iteration")
parser.add_argument("--ignore-sigterm", action="store_true")
parser.add_argument("--spawn-children", type=int, default=0, help="start N sleeping children first")
parser.add_argument("--detach-children", action="store_true", help="children call setsid()")
parser.add_argument("--die-at-start", action="store_true", help="SIGKILL itself once the children are started")
parser.add_argument("--checkpoint-at", type=int, help="print a checkpoint-save line after this iteration")
parser.add_argument("--checkpoint-s", type=float, default=0.0, help="seconds the checkpoint save takes")
parser.add_argument("--nan-at", type=int, help="this iteration's loss is NaN and Megatron counts it")
args = parser.parse_args()

if args.ignore_sigterm:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
for _ in range(args.spawn_children):
    child = f"import os, time\nif {args.detach_children!r}: os.setsid()\ntime.sleep(600)"
    started = subprocess.Popen([sys.executable, "-c", child])
    print(f"child pid {started.pid}", flush=True)
if args.die_at_start:
    time.sleep(0.3)  # the children have called setsid by now
    os.kill(os.getpid(), signal.SIGKILL)
print(f"pid {os.getpid()} MASTER_PORT={os.environ.get('MASTER_PORT')}", flush=True)

total = args.print_total or args.iters
for iteration in range(1, args.iters + 1):
    time.sleep(args.interval_s)
    if iteration % args.log_interval == 0:
        print(f" [2026-01-01 00:00:00.000000] iteration {iteration:8d}/{total:8d} | consumed samples: "
              f"{iteration * 8:12d} | elapsed time per iteration (ms): {args.interval_s * 1000:.1f} |"
              + (" lm loss: nan | number of nan iterations:   1 |" if args.nan_at == iteration else
                 f" lm loss: {10.0 / iteration:.6E} | number of nan iterations:   0 |"), flush=True)
    if args.checkpoint_at == iteration:
        print(f"saving checkpoint at iteration {iteration:7d} to /tmp/ckpt in torch_dist format", flush=True)
        time.sleep(args.checkpoint_s)
    if args.exit_after == iteration:
        sys.exit(args.exit_code)
    if args.stall_after == iteration:
        while True:
            time.sleep(60)
sys.exit(args.exit_code)
