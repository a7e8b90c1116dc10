"""What the estimator predicted for one layout on one device, before it ran: the one prediction type.

`diagnose` prices the layouts it proposes with it, the suite predicts every combo with it (calibrated on the
cluster's runs, the uncalibrated figures beside), and the report, run deck, JUnit and history read it back from
`suite.json`. Its field names are part of that file and of `suite run --json`: add fields, never rename them.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Prediction(BaseModel):
    """Per GPU, memory on the most-loaded rank; None fields: not predicted."""

    # NaN/Inf are written as "NaN"/"Infinity" strings, which read back as floats (JSON's null would not).
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")

    step_time_ms: float | None = None
    tokens_per_s_per_gpu: float | None = None
    tflops_per_gpu: float | None = None
    mfu_pct: float | None = None
    memory_gib: float | None = None
    capacity_gib: float | None = Field(default=None, description="The device's memory the prediction fits in.")
    note: str = ""
    device: str = Field(default="", description="The GPU (or this machine's CPU) the prediction modelled.")
    family: str = Field(default="", description="dense, moe or hybrid: what the calibration matches runs on.")
    components_ms: dict[str, float] = Field(
        default_factory=dict, description="The step-time model's terms, ms per step (compute, recompute, tp_comm, "
                                          "cp_comm, ep_comm, pp_comm, pp_bubble, cpu_offload, dp_comm, optimizer, "
                                          "fixed), as calibrated.")
    uncalibrated_step_time_ms: float | None = None
    uncalibrated_tokens_per_s_per_gpu: float | None = None
    uncalibrated_components_ms: dict[str, float] = Field(default_factory=dict)
    calibration: str = Field(default="", description="How it was calibrated on the cluster's runs, or why not.")
    calibration_runs: list[str] = Field(default_factory=list, description="The runs the calibration used.")
    calibrated_in_run: bool = Field(
        default=False, description="Calibrated only on this suite run's earlier runs (its smoke run first): a "
                                   "cluster the history has no runs of. Shown, never gated: those runs share whatever "
                                   "slows the cluster now.")
    band_pct: float | None = Field(default=None, description="Error band: p90 of the held-out |error|, %.")

    @property
    def fits(self) -> bool:
        """Whether the predicted memory fits the device's (False when either is unknown)."""
        return self.memory_gib is not None and self.capacity_gib is not None and self.memory_gib <= self.capacity_gib

    @property
    def step_time_s(self) -> float | None:
        return None if self.step_time_ms is None else self.step_time_ms / 1000.0

    @property
    def mfu(self) -> float | None:
        """MFU as a fraction of the peak."""
        return None if self.mfu_pct is None else self.mfu_pct / 100.0
