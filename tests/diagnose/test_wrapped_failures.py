"""Failures read through any line prefix or wrapper, bare exceptions named by their frames, a compiled extension
built for another torch told from a crash, and a stuck process's stack dump read as a hang (FAKE excerpts:
tests/data/logs/INDEX.md, `fake/`)."""

from __future__ import annotations

from pathlib import Path

import pytest

FAKE = Path(__file__).resolve().parents[1] / "data" / "logs" / "fake"


def _first(cli, name: str) -> dict:
    result = cli("diagnose", str(FAKE / name), "--json")
    assert result.exit_code == 0, result.stderr
    return result.json()["findings"][0]


def test_a_ray_wrapped_bare_assertion_is_named_by_its_frames(cli):
    finding = _first(cli, "ray_worker_bare_assertion_dataset_builder.log")
    assert finding["category"] == "dataloader_error"
    assert ("AssertionError in datasets/blended_megatron_dataset_builder.py:260 in _build_blended_dataset_splits "
            "(assert len(prefixes) == len(weights))") in finding["title"]


@pytest.mark.parametrize(("name", "command"), [
    ("fused_kernel_undefined_symbol.log", "rm -rf <Megatron-LM>/megatron/legacy/fused_kernels/build"),
    ("te_library_loader_bare_stopiteration.log", "'transformer_engine[pytorch]'"),
])
def test_an_extension_built_for_another_torch_is_no_crash(cli, name: str, command: str):
    finding = _first(cli, name)
    assert finding["category"] == "config_error" and "compiled extension" in finding["title"]
    assert any(command in fix["flag"] for fix in finding["fixes"])


@pytest.mark.parametrize(("name", "where"), [
    ("pyspy_dump_stuck_in_synchronize.log", "synchronize (torch/cuda/__init__.py:801)"),
    ("faulthandler_stuck_in_all_reduce.log", "distributed_c10d.py\", line 2501 in all_reduce"),
])
def test_a_stack_dump_of_a_stuck_process_is_a_hang_naming_where_it_waits(cli, name: str, where: str):
    finding = _first(cli, name)
    assert finding["category"] == "hang" and where in finding["title"]


def test_a_rank_prefixed_exception_is_read():
    from megapilot.diagnose import diagnose

    finding = diagnose([FAKE / "rank_prefixed_typeerror.log"]).findings[0]
    assert finding.category == "process_crash" and "TypeError" in finding.title and "rank 1" in finding.title
