"""The executors, by name: each registers itself, so a new one is one module plus its tests.

    @register_executor
    class KubernetesExecutor(JobFollower[KubernetesJob]):
        name = "kubernetes"
        capabilities = Capabilities(launcher="torchrun", ...)
        ...  # submit, poll and _stop; JobFollower (following.py) gives logs, cancel, wait, result and close

Where they are found: every module of the `megapilot.execute` package (imported on the first
question, so the core still starts without them), and any module named by a `megapilot.executors`
entry point (an executor shipped in another distribution). Nothing outside `megapilot.execute`
names an executor: the suite asks `capabilities` and calls the protocol's methods.
"""

from __future__ import annotations

import importlib
import pkgutil
from importlib.metadata import entry_points
from typing import TypeVar

import megapilot.execute as package
from megapilot.errors import MegapilotError
from megapilot.execute.base import Capabilities, Executor, ExecutorSettings

ENTRY_POINT_GROUP = "megapilot.executors"
ExecutorClass = TypeVar("ExecutorClass", bound=type)
_REGISTRY: dict[str, type[Executor]] = {}
_discovered = False


def register_executor(cls: ExecutorClass) -> ExecutorClass:
    """Class decorator: make the executor known by its `name` (a second class of the same name is refused)."""
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise TypeError(f"{cls.__name__} needs a class attribute `name`")
    if not isinstance(getattr(cls, "capabilities", None), Capabilities):
        raise TypeError(f"{cls.__name__} needs a class attribute `capabilities` (a Capabilities)")
    known = _REGISTRY.get(name)
    if known is not None and known is not cls and known.__qualname__ != cls.__qualname__:
        raise TypeError(f"executor {name!r} is already registered by {known.__module__}.{known.__qualname__}")
    _REGISTRY[name] = cls
    return cls


def _discover() -> None:
    """Import every module of this package and every entry point once; each registers what it defines."""
    global _discovered
    if _discovered:
        return
    for module in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if not module.name.startswith("_"):
            importlib.import_module(f"{package.__name__}.{module.name}")
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        entry.load()
    _discovered = True


def rediscover() -> None:
    """Look for executors again (after the package path grew, say)."""
    global _discovered
    _discovered = False
    _discover()


def executor_names() -> tuple[str, ...]:
    """Every registered executor's name, sorted."""
    _discover()
    return tuple(sorted(_REGISTRY))


def executor_class(name: str, *, field: str = "executor") -> type[Executor]:
    """The executor registered as `name`; MegapilotError listing the known ones when none is."""
    _discover()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise MegapilotError(f"unknown executor {name!r}", field=field,
                             fix="use one of: " + ", ".join(sorted(_REGISTRY))) from None


def capabilities(name: str) -> Capabilities:
    return executor_class(name).capabilities


def make_executor(name: str, settings: ExecutorSettings | None = None) -> Executor:
    """The executor `name`, built from `settings` (its own checks raise MegapilotError)."""
    return executor_class(name).from_settings(settings or ExecutorSettings())


__all__ = ["ENTRY_POINT_GROUP", "capabilities", "executor_class", "executor_names", "make_executor",
           "rediscover", "register_executor"]
