"""The suite's stage names in CVS's pinned order, apart from the lifecycle that runs them: the dry run and the
command line name and check stages without loading every stage's module."""

from __future__ import annotations

STAGES: tuple[str, ...] = ("prepare", "preflight", "collectives", "tokenizer", "smoke", "checkpoint", "train",
                           "metrics", "loss_curve", "results", "teardown")
COMBO_STAGES = ("train", "metrics", "loss_curve")
EARLY_STAGES = ("prepare", "preflight", "collectives", "tokenizer", "smoke", "checkpoint")
NON_BLOCKING_STAGES = ("collectives",)  # a FAIL here fails the run, not the stages after it

__all__ = ["COMBO_STAGES", "EARLY_STAGES", "NON_BLOCKING_STAGES", "STAGES"]
