"""megapilot: plan, script, run, validate and diagnose Megatron-Core training runs."""

from megapilot.errors import MegapilotError

__version__ = "0.1.0"
__all__ = ["MegapilotError", "__version__"]
