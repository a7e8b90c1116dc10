"""A suite config's threshold file and sweep: the threshold table, the cells of `sweep.runs` with their overlays
merged, and CVS's rule that every run cell has a threshold cell."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from megapilot.spec import GPUSpec
from megapilot.suite.cells import (
    DEFAULT_CELL_KEY,
    TRAIN_PARAM_ALIASES,
    CellKey,
    SweepCell,
    TrainParams,
    cell_key_text,
    default_cell,
    normalise_precision,
    parse_cell_key,
    sweep_cell,
)
from megapilot.suite.config_read import _dotted, _fix_of, _message, near_key, unknown_key
from megapilot.suite.metric_table import METRICS, measured_name
from megapilot.suite.parsing import json_hint, parse_json
from megapilot.suite.thresholds import (
    THRESHOLD_KINDS,
    InfoThreshold,
    Peak,
    SpecIssue,
    ThresholdSpec,
    ThresholdTable,
    parse_threshold,
    peak_issue,
    spec_issues,
)

if TYPE_CHECKING:
    from megapilot.suite.config import LoadedSuite, SuiteCheck, SuiteConfig


THRESHOLD_SUFFIX = "threshold.json"


# ---- thresholds ---------------------------------------------------------------------------------
def _read_thresholds(config: SuiteConfig, config_path: Path, changeme: list[str],
                     check: SuiteCheck) -> tuple[ThresholdTable, Path | None]:
    if "threshold_json" in changeme:
        return {}, None
    path = _threshold_file(config, config_path, check)
    if path is None:
        return {}, None
    duplicates: list[str] = []
    try:
        raw = parse_json(path.read_text(encoding="utf-8"), duplicates=duplicates)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        check.add("threshold_json", f"cannot read {path} ({' '.join(str(exc).split())}){json_hint(exc)}",
                  "point threshold_json at a JSON threshold file")
        return {}, None  # no path: a file that cannot be read has no cells to hold the runs' cells against
    if not isinstance(raw, dict):
        check.add("threshold_json", f"{path} does not hold a mapping of cells", "write cell key -> metric -> spec")
        return {}, None
    for key in duplicates:
        check.add("threshold_json", f"key {key!r} appears more than once in one object of {path}; only the last one "
                  "would count", "keep one entry per key")
    return _threshold_table(raw, check, enforce=config.enforce_thresholds), path


def _threshold_file(config: SuiteConfig, config_path: Path, check: SuiteCheck) -> Path | None:
    folder = config_path.parent
    if config.threshold_json:
        path = Path(config.threshold_json).expanduser()
        path = path if path.is_absolute() else folder / path
        if not path.is_file():
            what = "is a folder, not a file" if path.is_dir() else "does not exist"
            check.add("threshold_json", f"{path} {what}",
                      "point threshold_json at the threshold file (relative to the config's folder)")
            return None
        return path
    candidates = sorted(folder.glob(f"*{THRESHOLD_SUFFIX}"))
    if len(candidates) > 1:
        names = ", ".join(p.name for p in candidates)
        check.add("threshold_json", f"empty, and several threshold files sit next to the config: {names}",
                  "name the one to use in threshold_json")
        return None
    if not candidates:
        message = "empty, and no *threshold.json sits next to the config"
        if config.enforce_thresholds:
            check.add("threshold_json", message, "add a threshold file, or set enforce_thresholds: false")
        else:
            check.warnings.append(f"threshold_json: {message}; every metric is recorded, none gated")
        return None
    return candidates[0]


def _threshold_table(raw: dict[str, Any], check: SuiteCheck, *, enforce: bool = True) -> ThresholdTable:
    table: ThresholdTable = {}
    issues: dict[tuple[str, SpecIssue], list[str]] = {}  # (metric, issue) -> the cells that say it
    unread: dict[tuple[str, str, str], list[str]] = {}  # (metric, problem, fix) of a spec not read -> its cells
    written_as: dict[str, str] = {}  # canonical cell key -> the key the file wrote it as
    for cell, metrics in raw.items():
        if cell.startswith("_"):
            continue
        canonical = _canonical_key(cell)
        if canonical in written_as:
            check.add(f"thresholds.{cell}", f"{written_as[canonical]!r} and {cell!r} are the same cell "
                      f"({canonical}); only the last one would count", "keep one of them")
        written_as[canonical] = cell
        if not isinstance(metrics, dict):
            check.add(f"thresholds.{cell}", "a threshold cell must map metric names to specs",
                      '{"training.tokens_per_gpu": {"kind": "min", "value": 1000}}')
            table[canonical] = {}  # the cell is there, malformed: not also missing for its run
            continue
        specs: dict[str, ThresholdSpec] = {}
        written: dict[str, str] = {}  # measured name -> the name the file gates it under
        for metric, spec in metrics.items():
            if metric.startswith("_"):
                continue
            name = measured_name(metric)  # another dialect's name of a measured metric gates that metric
            if name in written:
                unread.setdefault((metric, f"gates {name} a second time (as {written[name]} and as {metric}, two "
                                           "names of one metric)", f"keep one of {written[name]} and {metric}"),
                                  []).append(cell)
                continue
            try:
                specs[name] = parse_threshold(spec)
            except ValueError as exc:
                unread.setdefault((metric, str(exc), _spec_fix(name, spec, str(exc))), []).append(cell)
                continue
            written[name] = metric
            for issue in spec_issues(metric, spec, specs[name]):
                issues.setdefault((metric, issue), []).append(cell)
        table[canonical] = specs
    for (metric, problem, fix), cells in unread.items():  # a problem enforced or not: the table cannot be read
        check.add(*_once(metric, problem, cells), fix)
    _report_spec_issues(issues, check, enforce=enforce)
    return table


_NUMERIC_FIELDS = ("value", "tolerance_pct", "min_ratio")  # a spec's numeric fields (threshold kinds)


def _spec_fix(name: str, spec: Any, problem: str = "") -> str:
    """What to do about a spec that cannot be read. A number written as text with its unit (`"300 TFLOPs"`, the way a
    data sheet says it) is the common slip: the fix names the field, the unit the gate compares in and the number. A
    number out of its field's bounds (a negative tolerance_pct) is told the bound."""
    bound = re.match(r"(\w+): Input should be (.+?)(?: \(got .*\))?$", problem)
    if bound is not None and ("greater" in bound[2] or "less" in bound[2]):
        return f"give {bound[1]} a value that is {bound[2]}"
    if isinstance(spec, dict):
        for field in _NUMERIC_FIELDS:
            text = spec.get(field)
            if not isinstance(text, str) or _is_number(text):  # "300" is read as 300, as CVS's loader reads it
                continue
            # the ratios (min_ratio's value, predicted's min_ratio) have no unit; a band is in %
            unit = ("%" if field == "tolerance_pct" else "" if field == "min_ratio" or spec.get("kind") == "min_ratio"
                    else METRICS[name].unit if name in METRICS else "")
            # the number only where a space parts it from the unit: in `1.2k tok/s` the k scales it
            number = re.match(r"\s*([-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?)\s", text)
            return (f"write {field} as a bare JSON number" + (f" in {unit}" if unit else "")
                    + ", without quotes or units" + (f" ({field}: {number.group(1)})" if number else ""))
    return f"use kind {'/'.join(THRESHOLD_KINDS)} with its fields"


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _once(metric: str, message: str, cells: list[str]) -> tuple[str, str]:
    """The path and message of what a threshold file says of a metric in several cells (it repeats a metric's spec in
    every cell), said once: at its first cell, with how many others say the same."""
    return f"thresholds.{cells[0]}.{metric}", message + (
        f" (and in {len(cells) - 1} other cell(s))" if len(cells) > 1 else "")


def _report_spec_issues(issues: dict[tuple[str, SpecIssue], list[str]], check: SuiteCheck, *, enforce: bool) -> None:
    """Each issue once, at its first cell: a problem when it settles or misreads an enforced gate, else a warning, as
    run time would record it."""
    for (metric, issue), cells in issues.items():
        path, message = _once(metric, issue.message, cells)
        if issue.blocks and enforce:
            check.add(path, message, issue.fix)
        elif issue.blocks:
            check.warnings.append(f"{path}: {message} (enforce_thresholds false: recorded only)")
        else:
            check.warnings.append(f"{path}: {message} — fix: {issue.fix}")


def check_peak_bounds(suite: LoadedSuite, check: SuiteCheck) -> None:
    """With the suite's GPU known: a gate each cell's dense peak settles (a TFLOP/s/GPU floor above the GPU's peak at
    the cell's precision can never pass), said as the threshold file's other settled bounds are, once per metric and
    peak at its first cell. A cell the GPU cannot run (skipped) gates nothing."""
    if suite.gpu is None:
        return
    issues: dict[tuple[str, SpecIssue], list[str]] = {}
    for cell in suite.cells:
        peak = Peak.of(suite.gpu, cell.precision)
        if peak is None or cell.skip_reason is not None:
            continue
        for metric, spec in suite.thresholds.get(cell.key, {}).items():
            issue = peak_issue(metric, spec, peak)
            if issue is not None:
                issues.setdefault((metric, issue), []).append(cell.key)
    _report_spec_issues(issues, check, enforce=suite.config.enforce_thresholds)


def cpu_gate_warnings(table: ThresholdTable) -> list[str]:
    """For a CPU suite: a warning for each gate on a metric a CPU run cannot have (the metric table's `gpu_only`),
    once, at its first cell: it can never be measured, so it is SKIPPED on every run (an `info` spec records it as
    not measured, as always)."""
    cells_of: dict[str, list[str]] = {}
    for cell, specs in table.items():
        for metric, spec in specs.items():
            if metric in METRICS and METRICS[metric].gpu_only and not isinstance(spec, InfoThreshold):
                cells_of.setdefault(metric, []).append(cell)
    return [f"thresholds.{cells[0]}.{metric}: {METRICS[metric].gpu_only}: this gate can never be measured on a CPU "
            f"suite and is SKIPPED on every run" + (f" (and in {len(cells) - 1} other cell(s))" if len(cells) > 1
                                                    else "")
            + " — fix: gate it in a GPU suite, or remove it from this one"
            for metric, cells in cells_of.items()]


def _canonical_key(key: str) -> str:
    try:
        return parse_cell_key(key).key
    except ValueError:
        return key


# ---- cells --------------------------------------------------------------------------------------
COMBINATION_LABEL = "name"  # CVS's label of a combination (`llama3_3_70b_mbs1_gbs64_FP8`): kept, not a setting


def _check_param_keys(raw: dict[str, Any], check: SuiteCheck) -> None:
    """Keys of train_params and of each combination's body that TrainParams lacks. TrainParams keeps them (CVS files
    carry keys of their own), so a slip of a known key would run another layout without a word
    (`pipline_parallelism: 2` trains with PP 1): a problem. Any other key is a warning, as at the top level."""
    sections: list[tuple[str, Any]] = [("train_params", raw.get("train_params"))]
    sweep = raw.get("sweep")
    combinations = sweep.get("combinations") if isinstance(sweep, dict) else None
    if isinstance(combinations, dict):
        sections += [(f"sweep.combinations.{key}", body) for key, body in combinations.items()]
    known = list(TrainParams.model_fields)
    for where, body in sections:
        if not isinstance(body, dict):
            continue  # the schema says what is wrong with it
        for key in body:
            if key in TrainParams.model_fields or (key == COMBINATION_LABEL and where != "train_params"):
                continue
            if near_key(key, known, TRAIN_PARAM_ALIASES) is not None:
                check.add(f"{where}.{key}", *unknown_key(key, known, TRAIN_PARAM_ALIASES))
            else:
                check.warnings.append(f"{where}.{key}: not a setting of the Megatron suite; ignored (as CVS does)")


_KEY_FIELDS = (("micro_batch_size", "mbs"), ("global_batch_size", "gbs"), ("precision", "precision"))


def _build_cells(config: SuiteConfig, raw: dict[str, Any], check: SuiteCheck) -> list[tuple[str, TrainParams]]:
    """(canonical key, merged params) of every run, in run order; problems for every bad key or overlay."""
    sweep = config.sweep
    if not sweep.combinations and not sweep.runs:
        return [(DEFAULT_CELL_KEY, config.train_params)]
    merged = _combinations(config, check)
    if sweep.combinations and not sweep.runs:
        check.add("sweep.runs", "combinations are given but no runs select them",
                  "list the combination keys to run, in order, under sweep.runs")
    cells: list[tuple[str, TrainParams]] = []
    for index, run in enumerate(sweep.runs):
        if run not in sweep.combinations:
            known = ", ".join(sweep.combinations) or "none"
            check.add(f"sweep.runs[{index}]", f"{run!r} is not a key of sweep.combinations",
                      f"use one of: {known}")
        elif run in merged:
            cells.append(merged[run])
    seen = [key for key, _ in cells]
    for key in sorted({k for k in seen if seen.count(k) > 1}):
        check.warnings.append(f"sweep.runs: {key} is listed more than once; it runs once per listing")
    return cells


def _combinations(config: SuiteConfig, check: SuiteCheck) -> dict[str, tuple[str, TrainParams]]:
    merged: dict[str, tuple[str, TrainParams]] = {}
    canonical_seen: dict[str, str] = {}
    base = config.train_params.model_dump()
    for raw_key, overlay in config.sweep.combinations.items():
        where = f"sweep.combinations.{raw_key}"
        try:
            key = _combination_key(raw_key, overlay)
        except ValueError as exc:
            check.add(where, str(exc), "write the key as MBS=<mbs>,GBS=<gbs>,PRECISION=<precision>, or give "
                                       "the body micro_batch_size, global_batch_size and precision")
            continue
        if key.key in canonical_seen:
            check.add(where, f"the same cell as {canonical_seen[key.key]!r}", "keep one combination per cell")
            continue
        canonical_seen[key.key] = raw_key
        if not _overlay_agrees(key, overlay, where, check):
            continue
        params = _merge(base, overlay, {"micro_batch_size": key.mbs, "global_batch_size": key.gbs,
                                        "precision": key.precision}, where, check)
        if params is not None:
            merged[raw_key] = (key.key, params)
    return merged


def _combination_key(raw_key: str, overlay: dict[str, Any]) -> CellKey:
    """The cell of a combination: its `MBS=..,GBS=..,PRECISION=..` key, or, for a free-form id whose body names all
    three fields, the cell the body names, as CVS's loader derived the threshold key (`MegatronVariantConfig.cell_key()`
    at ROCm/cvs 15ea03dd, the form its mi355x files still use: `"llama3_1_8b-mi355x-bs128-mbs4-fp8": {"name": ..,
    "micro_batch_size": "4", ...}`). ValueError (the key's own) when neither gives one."""
    try:
        return parse_cell_key(raw_key)
    except ValueError:
        values = [overlay.get(field) for field, _ in _KEY_FIELDS]
        if any(value is None for value in values):
            raise
        return parse_cell_key(cell_key_text(*values))


def _overlay_agrees(key: Any, overlay: dict[str, Any], where: str, check: SuiteCheck) -> bool:
    agrees = True
    for field, attribute in _KEY_FIELDS:
        if field not in overlay:
            continue
        expected = getattr(key, attribute)
        given = str(overlay[field]).strip()
        given = _precision_or_self(given) if field == "precision" else given
        if given != str(expected):
            check.add(f"{where}.{field}", f"{overlay[field]!r} disagrees with the key ({expected})",
                      "make the body match the key, or drop it from the body")
            agrees = False
    return agrees


def _precision_or_self(text: str) -> str:
    """The precision's canonical name (`te_fp8` -> FP8), or the text as given when it names none."""
    try:
        return normalise_precision(text)
    except ValueError:
        return text.upper()


def _merge(base: dict[str, Any], overlay: dict[str, Any], from_key: dict[str, Any], where: str,
           check: SuiteCheck) -> TrainParams | None:
    try:
        return TrainParams.model_validate({**base, **overlay, **from_key})
    except ValidationError as exc:
        for error in exc.errors():
            field = _dotted(error["loc"])
            path = f"{where}.{field}" if field in overlay else f"train_params.{field}"
            check.add(path, _message(error), _fix_of(error, path))  # a bound is fixed by the bound, not a retype
        return None


def _check_threshold_coverage(config: SuiteConfig, cells: list[tuple[str, TrainParams]],
                              thresholds: ThresholdTable, threshold_path: Path | None, check: SuiteCheck) -> None:
    """CVS's rule: every run cell has a threshold cell and every threshold cell a run (warnings when not
    enforced)."""
    if threshold_path is None:
        return
    run_keys = {key for key, _ in cells}
    name = threshold_path.name
    findings = [(f"thresholds.{key}", f"run cell {key} has no threshold cell in {name}",
                 f"add a {key!r} cell to {name}") for key in sorted(run_keys - set(thresholds))]
    # a run whose combination was refused (its problem is said at the combination) still owns its threshold cell:
    # telling the user to remove that cell would leave the run without one once its combination is fixed
    refused = {_run_cell_key(run, config.sweep.combinations[run]) for run in config.sweep.runs
               if run in config.sweep.combinations}
    findings += [(f"thresholds.{key}", f"threshold cell {key} in {name} matches no run",
                  "fix the key's spelling, add the cell to sweep.runs, or remove it")
                 for key in sorted(set(thresholds) - run_keys - refused)]
    for path, message, fix in findings:
        if config.enforce_thresholds:
            check.add(path, message, fix)
        else:
            check.warnings.append(f"{path}: {message} (enforce_thresholds false: recorded only)")


def _run_cell_key(raw_key: str, overlay: dict[str, Any]) -> str:
    """The threshold cell key a run is held against: its canonical cell, or the key as written when it names none
    (as `_canonical_key` reads a threshold file's keys)."""
    try:
        return _combination_key(raw_key, overlay).key
    except ValueError:
        return raw_key


def _sweep_cells(cells: list[tuple[str, TrainParams]], gpu: GPUSpec | None, nodes: int) -> list[SweepCell]:
    built = []
    for key, params in cells:
        if key == DEFAULT_CELL_KEY:
            built.append(default_cell(params, gpu, nodes))
        else:
            built.append(sweep_cell(parse_cell_key(key), params, gpu))
    return built
