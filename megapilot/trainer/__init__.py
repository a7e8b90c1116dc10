"""Embedded Megatron-Core GPT pretraining (`python -m megapilot.trainer`), CPU-capable.

Needs the `train` extra (torch, megatron-core). Importing this package does not import torch;
`args`, `config`, `logfmt` and `flops` stay torch-free, the rest import it.
"""
