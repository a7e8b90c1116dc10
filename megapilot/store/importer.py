"""`megapilot history import FILE...`: measured runs from outside, into a cluster's history.

Accepted files:
    records   a JSON list, or JSON Lines, of objects with the keys of an `estimate --batch` case (`model`, `gpu`,
              `gpus`, `gpus_per_node`, `tp`, `pp`, `cp`, `ep`, `vpp`, `mbs`, `gbs`, `seq_len`, `precision`,
              `recompute`, `fsdp`, ...) plus `"measured": {...}` (any of tokens_per_s_per_gpu, step_time_s,
              tflops_per_gpu, peak_memory_gib), `"cluster": NAME` (or --cluster), optional `"software":
              {"container": ..., "megatron": ...}` and `"id"` (without one, the run's id is made of what it
              holds: cluster, case, measurement and software, so the same run imported again, from a copy or
              among new lines, replaces itself instead of counting twice, and two runs never share an id);
    run decks megapilot's `megatron_run_deck.json` and CVS's Megatron Run Deck: one run per cell that passed or was
              recorded (its model, GPU, nodes, layout and `actuals`); CVS cells carry no sequence length, so
              `--seq-len` (or the record default) gives it.
A bad record is refused alone, one line naming the record and the field; the good ones are kept.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from megapilot.errors import MegapilotError
from megapilot.estimate.cases import CaseFlags, case_from
from megapilot.estimate.history_calibration import implausible
from megapilot.store.measured import MEASURED_KEYS, MeasuredRow, cluster_name, from_case

NOT_FLAGS = ("measured", "cluster", "software", "id", "name", "source", "notes")
# A run deck cell's actuals, as the measured keys of a record (CVS's names; megapilot's deck uses the same).
DECK_ACTUALS = {
    "training.tokens_per_gpu": ("tokens_per_s_per_gpu", 1.0),
    "training.throughput_per_gpu": ("tflops_per_gpu", 1.0),
    "training.elapsed_time_per_iteration": ("step_time_s", 1e-3),  # ms (CVS's unit table says s; the value is ms)
    "training.max_allocated_gib": ("peak_memory_gib", 1.0),
}
RUN_DECK_FILE = "megatron_run_deck.json"  # the name a suite run's deck has in its run directory (megapilot.report)
CVS_GPUS_PER_NODE = 8  # CVS's deck names nodes only; its suite runs 8 GPUs per node
IMPORTABLE_STATUS = ("pass", "record")
MEASURED_UNITS = {"step_time_s": "seconds per step (not milliseconds)",
                  "tokens_per_s_per_gpu": "tokens per second of one GPU (not of the whole job)",
                  "tflops_per_gpu": "TFLOP/s of one GPU (not of the whole job)"}
FILE_FIX = "give a JSON list of records, JSON Lines (one record per line), or a run deck"


@dataclass(frozen=True)
class Refused:
    """A record that was not imported, and why: one line naming the record and the field."""

    record: str
    field: str
    problem: str

    def line(self) -> str:
        return f"{self.record}: {self.field}: {self.problem}"


@dataclass(frozen=True)
class ImportOutcome:
    kept: list[MeasuredRow]
    refused: list[Refused]
    names: list[str]  # the record each kept row came from (a refusal at the history names it)


def import_files(paths: list[Path], *, cluster: str | None = None, defaults: Mapping[str, object] | None = None
                 ) -> ImportOutcome:
    """Every record of every file, estimated and paired with its measurement; bad ones refused one by one."""
    kept: list[MeasuredRow] = []
    refused: list[Refused] = []
    first_of: dict[str, str] = {}  # each kept id and the record that gave it
    read: set[Path] = set()
    now = datetime.now(timezone.utc).isoformat(timespec="microseconds")
    for path in paths:
        if path.resolve() in read:  # `import runs.jsonl runs.jsonl`: its records once, not each refused as a copy
            refused.append(Refused(str(path), "FILE", "given twice: read once"))
            continue
        read.add(path.resolve())
        try:
            records = read_records(path)
        except MegapilotError as exc:
            refused.append(Refused(str(path), exc.field or "FILE", exc.problem + (f" ({exc.fix})" if exc.fix else "")))
            continue
        for name, raw in records:
            try:
                row = _row(name, raw, path, cluster, defaults or {}, now)
                if row.id in first_of and not _named(raw):  # the same record twice: one run, imported once
                    raise MegapilotError(f"the same run as {first_of[row.id]} (cluster, case and measurement)",
                                         field="record", fix="it is imported once; drop the copy")
                if row.id in first_of:  # one history row per id: the second would fail the whole write
                    raise MegapilotError(f"{row.id!r} is already the id of {first_of[row.id]} in this import",
                                         field="id", fix="give each record its own id")
            except MegapilotError as exc:
                refused.append(Refused(name, exc.field or "record", exc.problem + (f" ({exc.fix})" if exc.fix else "")))
                continue
            first_of[row.id] = name
            kept.append(row)
    return ImportOutcome(kept, refused, list(first_of.values()))


def read_records(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(name, record) pairs of a file: a JSON list, JSON Lines, or a run deck (one record per importable cell)."""
    if path.is_dir():  # a suite run's directory: what in it to pass, or to record
        if (path / RUN_DECK_FILE).is_file():
            raise MegapilotError(f"{path} is a directory", field="FILE",
                                 fix=f"pass its run deck, {path / RUN_DECK_FILE}")
        if (path / "suite.json").is_file():
            raise MegapilotError(f"{path} is a suite run's directory, not measured runs to import", field="FILE",
                                 fix=f"record it with `megapilot history record {path}`")
    if not path.is_file():
        raise MegapilotError(f"{path} is not a file", field="FILE", fix="pass JSON, JSON Lines or run deck files")
    text = path.read_text(encoding="utf-8", errors="replace")
    if not text.strip():
        raise MegapilotError(f"{path} is empty: it holds no record", field="FILE", fix=FILE_FIX)
    try:
        whole = json.loads(text)
    except ValueError:
        return _json_lines(path, text)
    if isinstance(whole, dict) and isinstance(whole.get("cells"), list):
        return _deck_records(path, whole)
    if isinstance(whole, dict) and {"run_id", "card", "combos"} <= whole.keys():
        raise MegapilotError(f"{path} is a suite run's result, not measured runs to import", field="FILE",
                             fix=f"record it with `megapilot history record {path.parent}`")
    if isinstance(whole, dict):
        whole = [whole]
    if not isinstance(whole, list):
        raise MegapilotError(f"{path} holds a JSON {type(whole).__name__}", field="FILE", fix=FILE_FIX)
    if not whole:
        raise MegapilotError(f"{path} holds an empty list: no record", field="FILE", fix=FILE_FIX)
    return [(f"{path.name}[{index}]", record) for index, record in enumerate(whole)]


def _json_lines(path: Path, text: str) -> list[tuple[str, dict[str, Any]]]:
    """One record per line; a line that is not JSON is refused alone, but a file none of whose lines is JSON is
    another format (CSV, YAML, a log) and is refused once, not line by line."""
    records: list[tuple[str, dict[str, Any]]] = []
    first_problem = None
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append((f"{path.name}:{number}", json.loads(line)))
        except ValueError as exc:
            first_problem = first_problem or f"line {number}: {exc}"
            records.append((f"{path.name}:{number}", {"_unreadable": str(exc)}))
    if first_problem and all(isinstance(record, dict) and "_unreadable" in record for _, record in records):
        raise MegapilotError(f"{path} is not JSON, JSON Lines or a run deck ({first_problem})", field="FILE",
                             fix=FILE_FIX)
    return records


def _deck_records(path: Path, deck: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """A megapilot or CVS run deck: each cell that passed or was recorded, as a record.

    A cell's id is its run's: every deck is named megatron_run_deck.json, so an id made of the file name would be
    the same for every run, and importing a second run's deck would replace the first's rows. A megapilot deck
    names its run (`<run_id>/<cell>`, the id `suite run` records the same combo under, so a run recorded there is
    not counted twice); a CVS deck names none, and its cells take ids made of what they hold (`run_id_of`): a
    deck written again at the same path by the next run is another run, and a copy of one is the same run."""
    nodes = _deck_nodes(deck)
    run = deck.get("run_id")
    run_name = str(run) if isinstance(run, str) and run.strip() else None
    records: list[tuple[str, dict[str, Any]]] = []
    for index, cell in enumerate(deck["cells"]):
        if not isinstance(cell, dict):  # refused by name (`_row`), not skipped without a word
            records.append((f"{path.name} cell {index}", cell))
            continue
        cell_id = cell.get("cell_id", index)
        name = f"{path.name} cell {cell_id}"
        status = str(cell.get("status", "pass")).lower()
        if status not in IMPORTABLE_STATUS:
            records.append((name, {"_refused": ("status", f"the cell's status is {status}: not a measurement "
                                                          "to calibrate on")}))
            continue
        actuals = cell.get("actuals") or {}
        try:  # a cell's own bad count or actuals refuse that cell alone (they failed the whole import, internally)
            cell_nodes = _count(cell.get("nodes") or nodes or 1, "nodes")
            per_node = _count(cell.get("gpus_per_node") or CVS_GPUS_PER_NODE, "gpus_per_node")
            if not isinstance(actuals, dict):
                raise MegapilotError(f"{actuals!r} is not an object of metrics", field="actuals",
                                     fix=f"give the cell's measured metrics by name, e.g. {next(iter(DECK_ACTUALS))}")
        except MegapilotError as exc:
            records.append((name, {"_refused": (exc.field, f"{exc.problem} ({exc.fix})")}))
            continue
        record: dict[str, Any] = {"model": cell.get("model"), "gpu": cell.get("gpu"),
                                  "gpus": cell_nodes * per_node, "gpus_per_node": per_node}
        if run_name is not None:
            record["id"] = f"{run_name}/{cell_id}"
        for key in ("tp", "pp", "cp", "ep", "vpp", "mbs", "gbs"):
            if cell.get(key) is not None:
                record[key] = cell[key]
        if cell.get("seq_length") is not None:
            record["seq_len"] = cell["seq_length"]
        if cell.get("precision"):
            record["precision"] = str(cell["precision"]).lower()
        record["measured"] = {key: actuals[metric] * scale for metric, (key, scale) in DECK_ACTUALS.items()
                              if isinstance(actuals.get(metric), (int, float)) and actuals[metric] > 0}
        records.append((name, record))
    return records


def _count(value: object, field: str) -> int:
    """A deck cell's count of nodes or GPUs per node: a positive whole number, or a string of one."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise MegapilotError(f"{value!r} is not a whole number of {field.replace('_', ' ')}", field=field,
                             fix="give a positive whole number")
    return value


def _deck_nodes(deck: Mapping[str, Any]) -> int | None:
    """Nodes from CVS's run card rows (`["Nodes", "2", false]`; megapilot's reads "2 x 8 GPUs")."""
    for row in deck.get("run_card_display") or []:
        if isinstance(row, (list, tuple)) and len(row) >= 2 and str(row[0]).lower() == "nodes":
            head = str(row[1]).split()[0] if str(row[1]).split() else ""
            if head.isdigit():
                return int(head)
    return None


def _row(name: str, raw: object, path: Path, cluster: str | None, defaults: Mapping[str, object], now: str
         ) -> MeasuredRow:
    if not isinstance(raw, dict):
        raise MegapilotError(f"is a JSON {type(raw).__name__}, not an object", field="record",
                             fix="give one object per record")
    if "_unreadable" in raw:
        raise MegapilotError(f"not JSON ({raw['_unreadable']})", field="line", fix="one JSON object per line")
    if "_refused" in raw:
        field, problem = raw["_refused"]
        raise MegapilotError(problem, field=field)
    measured = _measured(raw.get("measured"))
    run_cluster = raw.get("cluster") or cluster
    if run_cluster is not None and not isinstance(run_cluster, str):  # a number or list: not "no cluster"
        raise MegapilotError(f"{run_cluster!r} is not a name", field="cluster",
                             fix=f'give the cluster as a string, e.g. "cluster": "{run_cluster}"')
    if not isinstance(run_cluster, str) or not run_cluster.strip():
        raise MegapilotError("no cluster", field="cluster",
                             fix="give \"cluster\": NAME in the record or --cluster NAME")
    software = raw.get("software") or {}
    if not isinstance(software, dict):
        raise MegapilotError("must be an object", field="software", fix='e.g. {"container": "nemo:25.09"}')
    flags = {**{k: v for k, v in defaults.items() if v is not None},
             **{k: v for k, v in raw.items() if k not in NOT_FLAGS and v is not None}}
    case = case_from(CaseFlags.parse(flags))
    row_id = str(raw.get("id") or raw.get("name")) if _named(raw) else run_id_of(
        case.model.name, cluster_name(run_cluster), flags, measured, software)
    row = from_case(row_id, cluster_name(run_cluster), str(path), case, flags, measured, software, now)
    if "step_time_s" in measured and "tokens_per_s_per_gpu" in measured:
        # both given: the step calibrates, the tokens/s must tell of the same run (a mean of rates against a median
        # of times differs by 10-20 % on a busy host; 2x is another unit, the whole job's tokens/s, or another run)
        implied = row.gbs * row.seq_len / (measured["tokens_per_s_per_gpu"] * row.gpus)
        if not 0.5 <= implied / measured["step_time_s"] <= 2.0:
            raise MegapilotError(f"{measured['tokens_per_s_per_gpu']:g} implies a step of {implied:.4g} s, but "
                                 f"step_time_s is {measured['step_time_s']:g} s: the two are not of one run",
                                 field="measured.tokens_per_s_per_gpu",
                                 fix="give tokens per second of one GPU and seconds per step of the same run, or "
                                     "only one of them")
    if row.measured_step_time_s and row.predicted_step_time_s:
        problem = implausible(row.predicted_step_time_s, row.measured_step_time_s)
        if problem is not None:
            given = next(key for key in ("step_time_s", "tokens_per_s_per_gpu", "tflops_per_gpu") if key in measured)
            what = (f"{measured[given]:g} s" if given == "step_time_s" else
                    f"{measured[given]:g} implies a step of {row.measured_step_time_s:.4g} s, which")
            raise MegapilotError(f"{what} {problem}", field=f"measured.{given}",
                                 fix=f"give {MEASURED_UNITS[given]}")
    return row


def _named(raw: Mapping[str, Any]) -> bool:
    return bool(raw.get("id") or raw.get("name"))


def run_id_of(model: str, cluster: str, flags: Mapping[str, object], measured: Mapping[str, float],
              software: Mapping[str, Any]) -> str:
    """The id of a record that names none, made of what it holds (not of its file's name or its line): the same run
    imported again, from a copy, or with lines added before it, keeps its id and replaces itself; two runs, even
    from files of one name in two folders, never share one (an id from the file name replaced the other's row)."""
    held = json.dumps({"cluster": cluster, "case": flags, "measured": measured, "software": software},
                      sort_keys=True, default=str)
    return f"{model}-{hashlib.sha256(held.encode()).hexdigest()[:12]}"


def _measured(raw: object) -> dict[str, float]:
    if raw is not None and not isinstance(raw, dict):  # a bare figure or a string: not "no measurement"
        raise MegapilotError(f"{raw!r} is not an object of measured figures", field="measured",
                             fix=f"give \"measured\": {{\"step_time_s\": ...}} with any of {', '.join(MEASURED_KEYS)}")
    if not isinstance(raw, dict) or not raw:
        raise MegapilotError("no measurement", field="measured",
                             fix=f"give \"measured\": {{...}} with any of {', '.join(MEASURED_KEYS)}")
    measured: dict[str, float] = {}
    for key, value in raw.items():
        if key not in MEASURED_KEYS:
            raise MegapilotError(f"unknown key {key!r}", field=f"measured.{key}",
                                 fix=f"use {', '.join(MEASURED_KEYS)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise MegapilotError(f"{value!r} is not a positive number", field=f"measured.{key}",
                                 fix="give the measured figure as a number")
        measured[key] = float(value)
    return measured


__all__ = ["ImportOutcome", "Refused", "import_files", "read_records", "run_id_of"]
