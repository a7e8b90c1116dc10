"""`python -m megapilot.trainer [Megatron-LM pretrain_gpt.py flags]` (usually under torchrun).

The `__main__` guard matters: Megatron's checkpoint writer starts helper processes with `spawn`,
which re-import this module.
"""

if __name__ == "__main__":
    import sys

    from megapilot.trainer.train import main

    sys.exit(main())
