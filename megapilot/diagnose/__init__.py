"""Diagnosis and optimisation: rules over parsed logs + the launch flags → findings with exact fixes.

Public API:
- `diagnose(paths, script=, flags=, gpu=, gpus=) -> Diagnosis` (`Diagnosis.findings`, ranked)
- `read_flags(script=, flags=) -> LaunchFlags`, `run_config(flags, gpu=, gpus=) -> RunConfig`
- `optimize(config, measured_step_time_s=) -> OptimizeReport`
- `Finding`, `Fix` (the `--json` shapes), `Prediction` (from `megapilot.estimate`)
"""

from megapilot.diagnose.engine import Diagnosis, diagnose, diagnose_log
from megapilot.diagnose.findings import Finding, Fix
from megapilot.diagnose.flags import LaunchFlags, RunConfig, read_flags, run_config
from megapilot.diagnose.optimize import OptimizeReport, RankedChange, optimize
from megapilot.diagnose.predict import Prediction, predict

__all__ = ["Diagnosis", "Finding", "Fix", "LaunchFlags", "OptimizeReport", "Prediction", "RankedChange", "RunConfig",
           "diagnose", "diagnose_log", "optimize", "predict", "read_flags", "run_config"]
