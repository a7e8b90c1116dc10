"""The flags without which no case (model + cluster + batch) can be built: one list for `megapilot.estimate.cases`
and the CLI's shared layout options (kept free of imports, so the CLI can read it without loading the specs)."""

REQUIRED_FLAGS = ("model", "gpu", "gpus", "gbs", "seq_len")
