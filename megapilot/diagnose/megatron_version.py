"""Which Megatron-LM release wrote a log: from its `arguments` block, else from the format of its lines.

Flag advice is only right in the flag names of the release that runs (flags are renamed and removed between
releases), so `logs parse` reports the release it recognises and `diagnose` writes its fixes in that
release's names. (It reads the launch package's flag tables, so it lives after `launch`, not in `logs`.)
- The `arguments` block prints every option of the parser by destination (`vars(args)`), so the committed
  flag table whose destinations the block matches best is the release: each table's destinations missing
  from the block, plus the block's destinations that only other releases have, count against it.
- A log that names only the NGC NeMo container it ran in (`nvcr.io/nvidia/nemo:25.09`, its banner's `NVIDIA Release`)
  or the Megatron-Bridge version tells the megatron-core version that container ships (`NEMO_CONTAINERS`, from the
  published component versions); a container not in that table still tells nothing.
- Without any of those, Megatron-LM's iteration line tells two eras apart: core_v0.16.0 added microseconds to its
  timestamp (`[2026-01-01 00:10:00.123456] iteration ...`; core_v0.15.0 and older print whole seconds).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any, Literal, NamedTuple

from megapilot.errors import MegapilotError
from megapilot.launch.megatron_args import FlagTable, committed_tables, flag_table, parse_version
from megapilot.logs import ParsedLog
from megapilot.logs.records import ArgumentsRecord, IterationRecord, ProgressMarker


class NemoContainer(NamedTuple):
    """An NGC NeMo framework container (`nvcr.io/nvidia/nemo:<tag>`) and the versions it ships."""

    tag: str  # YY.MM; a patch tag (25.09.01) is read as its YY.MM release (flag tables change per minor release)
    megatron_core: str
    megatron_bridge: str | None  # the Megatron-Bridge it ships (containers before 25.09 have none)


# The megatron-core (and Megatron-Bridge) version of each NeMo container, as NVIDIA's component tables publish them.
# Containers whose table was not found (24.12 to 25.07) are left out on purpose: a log naming one still tells no
# release. 25.11 and 26.02 ship development builds of 0.15.0 and 0.16.0 (`dev:0.15.0`, `main:0.16.0` there).
NEMO_CONTAINERS: tuple[NemoContainer, ...] = (
    # https://docs.nvidia.com/nemo-framework/user-guide/24.09/softwarecomponentversions.html
    NemoContainer("24.05", "0.7.0", None),
    # https://docs.nvidia.com/nemo-framework/user-guide/24.09/softwarecomponentversions.html
    NemoContainer("24.07", "0.8.0", None),
    # https://docs.nvidia.com/nemo-framework/user-guide/24.09/softwarecomponentversions.html
    NemoContainer("24.09", "0.9.0", None),
    # https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/main/docs/releases/software-versions.md
    NemoContainer("25.09", "0.14.0", "0.1.0rc3"),
    # https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/main/docs/releases/software-versions.md
    NemoContainer("25.11", "0.15.0", "0.2.0"),
    # https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/main/docs/releases/software-versions.md
    NemoContainer("26.02", "0.16.0", "0.3.0"),
    # https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/main/docs/releases/software-versions.md
    NemoContainer("26.04", "0.17.0", "0.4.0"),
)


def nemo_container(tag: str) -> NemoContainer | None:
    """The known container of an image tag or `NVIDIA Release` number (`25.09`, `25.09.01`), else None."""
    for container in NEMO_CONTAINERS:
        if tag == container.tag or tag.startswith(container.tag + "."):
            return container
    return None


def bridge_container(version: str) -> NemoContainer | None:
    """The container that ships exactly this Megatron-Bridge version, else None."""
    for container in NEMO_CONTAINERS:
        if container.megatron_bridge is not None and version == container.megatron_bridge:
            return container
    return None


# A dated iteration line (its timestamp's precision tells the release); public: `logs parse`'s table probes for it.
ITERATION_FORMAT_RE = re.compile(r"^\s*\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d+)?\]\s+iteration\s+\d+")
_MICROSECONDS_SINCE = "core_v0.16.0"


@dataclass(frozen=True)
class RecognisedVersion:
    """The release a log was written by (`release`: the committed table that matches it) and how it was told."""

    release: str
    source: Literal["version line", "arguments", "container", "format"]
    exact: bool  # the block printed exactly that release's options (arguments), or the era is certain (format)
    detail: str  # what was seen, for the user

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def table(self) -> FlagTable:
        return flag_table(self.release)


def recognise_megatron_version(log: ParsedLog) -> RecognisedVersion | None:
    """The release that wrote the log: the megatron-core version a line states (`release:megatron-core=` markers:
    pip, `megatron.core.__version__`, a launcher's banner), else its arguments block, else the NeMo container or
    Megatron-Bridge version it names (`NEMO_CONTAINERS`), else the format of its dated iteration lines; None when it
    tells none of those."""
    stated = _from_version_line(log.markers)
    if stated is not None:
        return stated
    if log.arguments is not None and log.arguments.values:
        return _from_arguments(log.arguments)
    shipped = _from_container(log.markers)
    if shipped is not None:
        return shipped
    return _from_format(log.iterations)


def release_lines(log: ParsedLog) -> list[str]:
    """What the log says of the software that ran (`megatron-core 0.16.1`, `nemo-container 25.02`), for a note."""
    return sorted({m.marker.removeprefix("release:").replace("=", " ") for m in log.markers
                   if m.marker.startswith("release:")})


def _from_version_line(markers: list[ProgressMarker]) -> RecognisedVersion | None:
    """The committed flag table of the stated megatron-core version: the newest release at or below it (flags
    change only with a release), exact when their numbers agree up to the patch level."""
    for marker in markers:
        if not marker.marker.startswith("release:megatron-core="):
            continue
        stated = marker.marker.split("=", 1)[1]
        found = _table_of(stated, "version line", f"megatron-core {stated} printed at {marker.file}:{marker.line}")
        if found is not None:
            return found
    return None


def _from_container(markers: list[ProgressMarker]) -> RecognisedVersion | None:
    """The flag table of the megatron-core version the named NeMo container (or Megatron-Bridge version) ships."""
    for marker in markers:
        what, _, value = marker.marker.removeprefix("release:").partition("=")
        if what == "nemo-container":
            container, named = nemo_container(value), f"NeMo container {value}"
        elif what == "megatron-bridge":
            container, named = bridge_container(value), f"Megatron-Bridge {value}"
        else:
            continue
        if container is None:
            continue
        found = _table_of(container.megatron_core, "container",
                          f"{named} named at {marker.file}:{marker.line} ships megatron-core "
                          f"{container.megatron_core} (the {container.tag} container's component table)")
        if found is not None:
            return found
    return None


def _table_of(stated: str, source: Literal["version line", "container"], told: str) -> RecognisedVersion | None:
    """The committed table of a megatron-core version: the newest release at or below it, else the oldest."""
    try:
        version = parse_version(stated)
    except MegapilotError:
        return None
    tables = [t for t in committed_tables() if t.version <= version]
    if not tables:  # older than every committed table: the oldest is the closest
        tables = list(committed_tables()[:1])
    table = tables[-1]
    exact = table.version[:2] == version[:2]
    return RecognisedVersion(release=table.release, source=source, exact=exact,
                             detail=told + ("" if exact else f"; {table.release} is the closest committed flag table"))


def _from_arguments(arguments: ArgumentsRecord) -> RecognisedVersion:
    printed = set(arguments.values)
    tables = committed_tables()
    every_dest = {f.dest for table in tables for f in table.flags.values()}
    scored = []
    for table in tables:
        dests = {f.dest for f in table.flags.values()}
        missing = len(dests - printed)
        foreign = len((printed & every_dest) - dests)
        scored.append((missing + foreign, missing, foreign, table.release))
    best = min(scored, key=lambda row: (row[0], row[1]))
    _, missing, foreign, release = best
    detail = (f"arguments block ({arguments.file}:{arguments.line}): {len(printed)} options; "
              f"{missing} of {release}'s options not printed, {foreign} printed that only other releases have")
    return RecognisedVersion(release=release, source="arguments", exact=missing == foreign == 0, detail=detail)


def _from_format(iterations: list[IterationRecord]) -> RecognisedVersion | None:
    for record in iterations:
        match = ITERATION_FORMAT_RE.match(record.text)
        if match is None:
            continue
        if match.group(1):
            return RecognisedVersion(
                release=committed_tables()[-1].release, source="format", exact=False,
                detail=f"iteration timestamps carry microseconds ({record.file}:{record.line}): "
                       f"{_MICROSECONDS_SINCE} or newer; the newest release is assumed")
        older = [t.release for t in committed_tables() if t.version < parse_version(_MICROSECONDS_SINCE)]
        return RecognisedVersion(
            release=older[-1], source="format", exact=False,
            detail=f"iteration timestamps in whole seconds ({record.file}:{record.line}): {older[-1]} or older")
    return None
