"""Standard-library names the core uses that Python 3.10 lacks, in one place.

The core installs on Python 3.10-3.13 (NGC containers and older clusters run different ones); each name
here is the stdlib's own on 3.11+ and an equivalent on 3.10, so the rest of the code imports it from
here and reads as if it targeted the newest Python.
"""

from __future__ import annotations

import sys
from enum import Enum

if sys.version_info >= (3, 11):
    from enum import StrEnum

    import tomllib
else:  # pragma: no cover - exercised by the Python 3.10 install, not by the 3.11 test run
    import tomli as tomllib

    class StrEnum(str, Enum):
        """enum.StrEnum of 3.11: members are str, and str()/format() give the value, not `Class.member`."""

        def __str__(self) -> str:
            return str(self.value)

        def __format__(self, spec: str) -> str:
            return format(str(self.value), spec)


__all__ = ["StrEnum", "tomllib"]
