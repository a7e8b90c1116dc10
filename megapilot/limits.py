"""Bounds on user inputs that layers below the spec package check too: the store's saved profile holds `--gpus` to
the bound `plan` holds it to, and reading the history must not import the spec package (`history` starts in half
the time without it), so the bound lives here, in a module that imports nothing."""

# The most GPUs one cluster may have: 2^20, five times the largest cluster built (xAI's Colossus, about 200,000
# GPUs) and 64 times the largest published Megatron-class job (Llama 3 405B on 16,384 H100s). More is a slip of
# digits, which the planner would lay out as it does any count (an 8B model over 10^7 GPUs at a fraction of 1 % MFU).
MAX_GPUS = 1_048_576
MAX_GPUS_REASON = "five times the largest cluster built, about 200,000 GPUs"
