"""Threshold files in CVS's cell-keyed form, and the gate each spec applies.

    {
      "_comment": "...",
      "MBS=4,GBS=128,PRECISION=FP8": {
        "training.throughput_per_gpu": {"kind": "min", "value": 100},
        "training.elapsed_time_per_iteration": {"kind": "max_ms", "value": 500},
        "training.mem_usage": {"kind": "max", "value": 0.85, "optional": true}
      }
    }

Kinds (CVS's, plus `baseline`):
    min / min_tok_s   actual >= value
    max / max_ms      actual <= value
    within            value*(1-p/100) <= actual <= value*(1+p/100), p = tolerance_pct
    min_ratio         actual / actual[reference] >= value (reference: another metric of the same cell)
    info              recorded, never gated
    baseline          within tolerance_pct of the median of the last `last_n` passing runs of the same
                      model/layout/GPU in the run history (no history yet: RECORD)
`optional: true`: a metric that is missing is SKIPPED instead of FAIL. Keys starting with `_` are comments.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

ThresholdKind = Literal["min", "min_tok_s", "max", "max_ms", "within", "min_ratio", "info", "baseline"]
THRESHOLD_KINDS: tuple[str, ...] = ("min", "min_tok_s", "max", "max_ms", "within", "min_ratio", "info", "baseline")
DEFAULT_CELL = "default"


class ThresholdSpec(BaseModel):
    """One metric's gate inside a threshold cell."""

    # CVS files carry comments and future fields: unknown keys are kept. A NaN or infinite bound gates nothing.
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    kind: ThresholdKind
    value: float | None = None
    tolerance_pct: float | None = Field(default=None, ge=0)
    reference: str | None = Field(default=None, description="min_ratio: the metric the ratio is taken against.")
    optional: bool = False
    last_n: int = Field(default=5, ge=1, description="baseline: how many earlier passing runs make the median.")

    @model_validator(mode="after")
    def _fields_of_kind(self) -> ThresholdSpec:
        if self.kind in ("min", "min_tok_s", "max", "max_ms", "within", "min_ratio") and self.value is None:
            raise ValueError(f"kind {self.kind!r} needs a numeric 'value'")
        if self.kind in ("within", "baseline") and self.tolerance_pct is None:
            raise ValueError(f"kind {self.kind!r} needs 'tolerance_pct'")
        if self.kind == "min_ratio" and not self.reference:
            raise ValueError("kind 'min_ratio' needs 'reference' (the metric the ratio is taken against)")
        return self

    def describe(self) -> str:
        """The gate as a short text: '>= 100', '<= 500 ms', '100 +/-5%', '>= 0.9 x ref', 'info'."""
        value = _short(self.value)
        if self.kind in ("min", "min_tok_s"):
            return f">= {value}"
        if self.kind == "max":
            return f"<= {value}"
        if self.kind == "max_ms":
            return f"<= {value} ms"
        if self.kind == "within":
            return f"{value} +/-{_short(self.tolerance_pct)}%"
        if self.kind == "min_ratio":
            return f">= {value} x {self.reference}"
        if self.kind == "baseline":
            return f"median of last {self.last_n} passing runs +/-{_short(self.tolerance_pct)}%"
        return "info" if self.value is None else f"info ({value})"


def _short(value: float | None) -> str:
    if value is None:
        return "?"
    return f"{value:g}"


# A threshold table: cell key -> metric name -> spec. Comment keys (leading `_`) are dropped on load.
ThresholdTable = dict[str, dict[str, ThresholdSpec]]

__all__ = ["DEFAULT_CELL", "THRESHOLD_KINDS", "ThresholdKind", "ThresholdSpec", "ThresholdTable"]
