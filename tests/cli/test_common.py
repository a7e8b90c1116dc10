"""The consoles off a terminal: a pipe, a file or a CI log gets every character and no colour codes."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest

from megapilot.cli.common import PIPED_WIDTH, OutputConsole, emit_json, read_text_file


def _piped(*args: str) -> str:
    """`megapilot ARGS | cat`: the installed command with stdout a pipe, in a clean environment."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FORCE_COLOR", "TTY_COMPATIBLE")}
    result = subprocess.run([sys.executable, "-m", "megapilot", *args], capture_output=True, text=True, env=env,
                            timeout=60, check=True)
    return result.stdout


@pytest.mark.parametrize("args", [("gpus",), ("suite", "templates")])
def test_piped_tables_are_not_cut_and_carry_no_colour(args):
    out = _piped(*args)
    assert "…" not in out and "\x1b[" not in out
    if args == ("gpus",):
        assert "hopper" in out and "H100-SXM5-80GB" in out  # cut to "hopp…" and "H100…" at 80 columns
        widest = max(len(line) for line in out.splitlines())
        assert 80 < widest < PIPED_WIDTH  # as wide as the table, not padded to the console width


def test_a_terminal_keeps_its_width_and_columns_wins(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert OutputConsole(force_terminal=True, width=100).width == 100
    assert OutputConsole(force_terminal=False).width == PIPED_WIDTH
    monkeypatch.setenv("COLUMNS", "90")
    assert OutputConsole(force_terminal=False).width == 90


@pytest.mark.parametrize(("edit", "said"), [
    ({"training": {"global_batch_size": 1001}},
     "global_batch_size: global_batch_size=1001 is not divisible by mbs*dp"),
    ({"parallel": {"dp": 3}}, "parallel: TP*PP*CP*DP = 1*1*1*3 = 3 but the cluster has 8 GPUs"),
])
def test_a_plan_file_whose_parts_disagree_is_refused_naming_the_field(tmp_path, edit, said):
    """Each part of a hand-edited plan may be valid alone and the whole not: a global batch its DP cannot split was
    written into a launch script Megatron refuses; a layout for 3 GPUs in a plan for 8 was blamed on the launch's
    node count. Both are the file's, refused when it is read."""
    import json

    from megapilot.catalog import get_gpu, get_model
    from megapilot.cli.common import load_plan_file
    from megapilot.errors import MegapilotError
    from megapilot.plan import Pins, plan
    from megapilot.spec import ClusterSpec, TrainingSpec

    saved = plan(get_model("tiny"), ClusterSpec.from_gpu_count(get_gpu("h100"), 8),
                 TrainingSpec(seq_length=128, global_batch_size=64), top=1, pins=Pins(tp=1, pp=1, cp=1)).to_saved_plan()
    raw = json.loads(saved.model_dump_json())
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(raw))
    assert load_plan_file(path).parallel == saved.parallel
    for part, fields in edit.items():
        raw[part].update(fields)
    path.write_text(json.dumps(raw))
    with pytest.raises(MegapilotError) as info:
        load_plan_file(path)
    assert info.value.field == "--plan" and said in info.value.problem
    assert "re-create the file with `megapilot plan ... --save`" in (info.value.fix or "")


def test_a_user_file_saved_with_a_byte_order_mark_reads_as_its_text(tmp_path):
    # a JSONL batch or plan file from an editor that writes a BOM: json.loads refuses "\ufeff{...}" on line 1
    batch = tmp_path / "cases.jsonl"
    batch.write_bytes(b'\xef\xbb\xbf{"model": "tiny"}\n')
    assert read_text_file(batch, flag="batch", what="a JSONL file", fix="-") == '{"model": "tiny"}\n'



class _Writes(io.StringIO):
    """A stdout that records the length of every write."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    def write(self, text: str) -> int:
        self.sizes.append(len(text))
        return super().write(text)


def test_a_large_json_document_is_written_as_it_is_encoded(monkeypatch):
    """`logs parse --json` of a few hundred MB of log is millions of records: the text goes out in bounded
    writes, never held whole (with the pieces it was joined from) before the first byte is written."""
    payload = {"iterations": [{"iteration": i, "elapsed_ms": 1000.5, "text": "x" * 40} for i in range(100_000)]}
    out = _Writes()
    monkeypatch.setattr(sys, "stdout", out)
    emit_json(payload)
    assert out.getvalue() == json.dumps(payload, indent=2) + "\n"
    assert len(out.sizes) > 10 and max(out.sizes) < len(out.getvalue()) // 10


def test_a_cluster_is_headed_with_its_gpu_count_in_thousands():
    from megapilot.catalog import get_gpu
    from megapilot.cli.common import cluster_label
    from megapilot.spec.hardware import ClusterSpec

    assert cluster_label(ClusterSpec.from_gpu_count(get_gpu("h100"), 8)) == "8 × H100"
    assert cluster_label(ClusterSpec.from_gpu_count(get_gpu("h100"), 16_384)) == "16,384 × H100"
