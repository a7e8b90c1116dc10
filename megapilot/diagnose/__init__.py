"""Diagnosis and optimisation: rules over parsed logs + the launch flags → findings with exact fixes.

Public API:
- `diagnose(paths, script=, flags=, gpu=, gpus=) -> Diagnosis` (`Diagnosis.findings`, ranked; `Diagnosis.notes`,
  each a `Note` with its `NoteKind`)
- `read_flags(script=, flags=) -> LaunchFlags`, `run_config(flags, gpu=, gpus=) -> RunConfig`,
  `apply_fixes(flags, fixes) -> LaunchFlags` (the launch as it reads after a proposal's edits)
- `optimize(config, log=, measured_step_time_s=) -> OptimizeReport` (a log of another run calibrates nothing)
- `log_mismatches(log, config) -> list[LogMismatch]`: where a log's own record of its run differs from the flags
- `Finding`, `Fix` (the `--json` shapes); `predict(...) -> megapilot.spec.Prediction | None`
"""

from megapilot.diagnose.engine import Diagnosis, Note, NoteKind, diagnose, diagnose_log
from megapilot.diagnose.findings import Finding, Fix
from megapilot.diagnose.flags import LaunchFlags, RunConfig, apply_fixes, read_flags, run_config
from megapilot.diagnose.mismatch import LogMismatch, log_mismatches
from megapilot.diagnose.optimize import OptimizeReport, RankedChange, optimize
from megapilot.diagnose.predict import predict

__all__ = ["Diagnosis", "Finding", "Fix", "LaunchFlags", "LogMismatch", "Note", "NoteKind", "OptimizeReport",
           "RankedChange", "RunConfig", "apply_fixes", "diagnose", "diagnose_log", "log_mismatches", "optimize",
           "predict", "read_flags", "run_config"]
