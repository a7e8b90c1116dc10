"""Embedded Megatron-Core GPT pretraining (`python -m megapilot.trainer`), CPU-capable.

Needs the `train` extra (torch, megatron-core). Importing this package does not import torch;
`args`, `config`, `logfmt`, `flops` and `corpus` (which `megapilot data prepare` calls) stay torch-free,
the rest import it.
"""
