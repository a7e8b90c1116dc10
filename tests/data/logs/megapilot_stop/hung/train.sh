#!/bin/bash
exec /work/main/.venv/bin/torchrun --nproc-per-node 2 /tmp/la/hang/worker.py
