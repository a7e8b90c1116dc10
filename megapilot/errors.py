"""The one error type for mistakes a user can make.

Every bad config, impossible layout, bad path or unknown name raises `MegapilotError` with the
field at fault and the fix. The CLI prints the message on one line and exits with code 2; the
library never prints it.
"""

from __future__ import annotations

EXIT_USER_ERROR = 2


class MegapilotError(ValueError):
    """A user error: names the field, what is wrong with it and how to fix it."""

    def __init__(self, message: str, *, field: str | None = None, fix: str | None = None):
        self.field = field
        self.fix = fix
        self.problem = message
        super().__init__(self._render())

    def _render(self) -> str:
        text = f"{self.field}: {self.problem}" if self.field else self.problem
        if self.fix:
            text = f"{text} — fix: {self.fix}"
        return text

    def to_dict(self) -> dict[str, str | None]:
        return {"error": str(self), "field": self.field, "fix": self.fix}


def from_validation_error(exc: Exception, *, prefix: str = "") -> MegapilotError:
    """Turn a pydantic ValidationError into a MegapilotError naming the first bad field."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return MegapilotError(str(exc))
    first = errors()[0]
    loc = ".".join(str(part) for part in first.get("loc", ()) if part != "__root__")
    field = ".".join(p for p in (prefix, loc) if p) or None
    message = first.get("msg", str(exc)).removeprefix("Value error, ")
    return MegapilotError(message, field=field)
