"""One concept, one place, read from the source with `ast`: one Finding, one Evidence, one metric table, and the
suite reading diagnose's findings rather than analysing logs itself."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[1] / "megapilot"


def _definitions() -> list[tuple[str, str]]:
    """(module path, name) of every class and module-level assignment in megapilot/."""
    found = []
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                found.append((str(path.relative_to(PACKAGE_ROOT)), node.name))
            elif isinstance(node, ast.AnnAssign | ast.Assign):
                targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
                found += [(str(path.relative_to(PACKAGE_ROOT)), t.id) for t in targets if isinstance(t, ast.Name)]
    return found


DEFINITIONS = _definitions()


def _where(name_part: str, *, exact: bool = False) -> list[str]:
    return sorted(f"{path}:{name}" for path, name in DEFINITIONS
                  if (name == name_part if exact else name_part in name))


def test_one_finding_and_one_evidence_type():
    assert _where("Finding") == ["diagnose/findings.py:Finding"]
    assert _where("Evidence") == ["logs/records.py:Evidence"]


def test_one_metric_table():
    assert _where("METRICS", exact=True) == ["suite/metric_table.py:METRICS"]
    assert _where("MetricInfo", exact=True) == ["suite/metric_table.py:MetricInfo"]


def test_one_failure_category_list():
    assert _where("Category", exact=True) == ["logs/signatures.py:Category"]


def test_the_suite_reads_diagnose():
    source = (PACKAGE_ROOT / "suite" / "metrics.py").read_text()
    assert "from megapilot.diagnose.engine import diagnose_log" in source
    assert "ErrorRecord" not in source and "has_nonfinite" not in source  # no error or NaN rule of its own


def _regex_literals_naming_exceptions() -> list[str]:
    """Where a string literal spells the alternation of Python exception-name endings (`Error|Exception`)."""
    found = []
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and "Error|Exception" in node.value:
                found.append(f"{path.relative_to(PACKAGE_ROOT)}:{node.lineno}")
    return found


def test_one_exception_line_pattern():
    assert [w for w in _where("EXCEPTION") if w.endswith("_RE")] == ["logs/signatures.py:EXCEPTION_LINE_RE"]
    (where,) = _regex_literals_naming_exceptions()
    assert where.startswith("logs/signatures.py:")


def _classes_declaring(field: str, any_of: set[str]) -> list[str]:
    """Classes that declare `field` and one of `any_of` as fields of their own."""
    found = []
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ClassDef):
                fields = {n.target.id for n in node.body
                          if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
                if field in fields and fields & any_of:
                    found.append(f"{path.relative_to(PACKAGE_ROOT)}:{node.name}")
    return found


def test_one_prediction_type():
    assert _where("Prediction", exact=True) == ["spec/prediction.py:Prediction"]
    # a predicted step and memory per GPU is a Prediction; EstimateResult is the estimator's whole answer it is read
    # from, and the deck, history and report rows compare a Prediction's fields with measurements without copying it
    assert _classes_declaring("memory_gib", {"step_time_ms", "step_time_s"}) == [
        "spec/plan_file.py:EstimateResult", "spec/prediction.py:Prediction"]


def test_the_layout_has_one_name_per_field():
    """A layout given in part on the command line says each of its fields by ParallelConfig's name; what is not a
    layout field (model, hardware, batch, run features) is named."""
    from dataclasses import fields

    from megapilot.cli.layout_options import LayoutFlags
    from megapilot.estimate.cases import CaseFeatures
    from megapilot.spec import ParallelConfig

    not_layout = {"model", "gpu", "gpus", "gpus_per_node", "gbs", "seq_len", "precision", "fp8_recipe", "optimizer",
                  "force_tp_across_nodes"} | {item.name for item in fields(CaseFeatures)}
    assert {item.name for item in fields(LayoutFlags)} - not_layout <= set(ParallelConfig.model_fields)


def test_the_layout_is_one_type():
    """Where a layout is held in part it is a LayoutPins, whose fields are ParallelConfig's (tests/spec proves
    that): the planner's pins, the flags of an estimate, a suite's sweep cell."""
    from dataclasses import fields
    from typing import get_type_hints

    from megapilot.estimate.cases import KNOWN_FLAGS, CaseFlags
    from megapilot.plan.space import SEARCHED_FIELDS, Pins
    from megapilot.spec import LAYOUT_FIELDS, LayoutPins
    from megapilot.suite.cells import SweepCell

    assert SweepCell.model_fields["layout"].annotation is LayoutPins
    assert not set(SweepCell.model_fields) & set(LAYOUT_FIELDS)
    assert issubclass(Pins, LayoutPins) and tuple(Pins.model_fields) == LAYOUT_FIELDS
    assert set(SEARCHED_FIELDS) <= set(LAYOUT_FIELDS)
    assert get_type_hints(CaseFlags)["layout"] is LayoutPins
    assert not {item.name for item in fields(CaseFlags)} & set(LAYOUT_FIELDS)  # no layout field of its own
    assert set(LAYOUT_FIELDS) <= KNOWN_FLAGS


def test_a_suite_combo_records_its_layout_as_the_one_type():
    """A suite combo's layout is a LayoutPins too (suite.json of earlier runs, with flat fields, still reads:
    tests/suite/test_results_earlier_formats.py)."""
    from megapilot.spec import LAYOUT_FIELDS, LayoutPins
    from megapilot.suite.results import RECORDED_LAYOUT_FIELDS, ComboResult

    assert ComboResult.model_fields["layout"].annotation is LayoutPins
    assert not set(ComboResult.model_fields) & set(LAYOUT_FIELDS)
    assert set(RECORDED_LAYOUT_FIELDS) <= set(LAYOUT_FIELDS)


def test_the_command_lines_options_are_the_estimates_flags_by_name():
    """What `estimate`, `script` and `plan` take as options is handed to `build_case` under the same names."""
    from dataclasses import fields

    from megapilot.cli.layout_options import FeatureFlags, LayoutFlags
    from megapilot.estimate.cases import KNOWN_FLAGS

    for options in (LayoutFlags, FeatureFlags):
        assert {item.name for item in fields(options)} <= KNOWN_FLAGS, options.__name__


def _sample(annotation: object) -> tuple[object, object]:
    """A legal value of a ParallelConfig field, as the command line types it and as ParallelConfig holds it."""
    from typing import Literal, get_args, get_origin

    if annotation in (int, int | None):
        return 2, 2
    if annotation is bool:
        return True, True
    if get_origin(annotation) is Literal:
        return get_args(annotation)[-1], get_args(annotation)[-1]
    if annotation == str | None:
        return "Et|tL", "Et|tL"
    listed, _none = get_args(annotation)  # tuple[Literal[...], ...] | None: given as a comma-separated list
    names = get_args(get_args(listed)[0])[:2]
    return ",".join(names), names


def test_every_layout_field_reaches_the_case_from_the_command_line_by_its_name():
    """Each of ParallelConfig's fields (but DP) is a command-line option of the same name whose value reaches the
    estimate's flags as the field's value: a field added to ParallelConfig without its option fails here."""
    from megapilot.cli.layout_options import LayoutFlags
    from megapilot.estimate.cases import CaseFlags
    from megapilot.spec import LAYOUT_FIELDS, ParallelConfig

    base = {"model": "llama3.1-8b", "gpu": "h100", "gpus": 8, "gbs": 8, "seq_len": 4096}
    for name in LAYOUT_FIELDS:
        typed, held = _sample(ParallelConfig.model_fields[name].annotation)
        flags = CaseFlags.parse(LayoutFlags(**{name: typed}).case_flags() | base)
        assert flags.layout.given().get(name) == held, name
