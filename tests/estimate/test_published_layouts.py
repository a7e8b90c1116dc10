"""Every layout published in both calibration files can be typed into the estimator and gets an answer.

A user types what the table printed (TP, PP, VPP, CP, EP, MBS, GBS, sequence, GPU count, FSDP); where Megatron
needs a pipeline split the table does not print (126 layers on PP 8 x VPP 8, 61 on PP 16), the refusal names
the rule and lists the splits that make it legal, and the user retypes it with the first of them - as the
published recipes do (`--account-for-embedding/loss-in-pipeline-split` for Llama 3.1 405B and Qwen3-235B, a
layout string for DeepSeek-V3). Rows that print no layout (papers giving only the GPU count) are not layouts.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from megapilot.catalog.models import load_presets
from megapilot.errors import MegapilotError
from megapilot.estimate import build_case, estimate
from megapilot.spec.model import ModelSpec, MoESpec

DATA = Path(__file__).resolve().parents[1] / "data" / "calibration"
ROWS = [row for name in ("published_calibration.json", "published_calibration_2025.json")
        for row in json.loads((DATA / name).read_text())]
LAYOUT_ROWS = [row for row in ROWS if row["tp"] is not None and row["pp"] is not None and row["gbs"] is not None]


def _model(row: dict[str, Any]) -> ModelSpec:
    """The catalog model of the row's shape, else one built from the row's own architecture fields."""
    presets = [p.spec for p in load_presets().values()]
    if row["layers"] is None:  # the row names the model only
        key = re.sub(r"[^a-z0-9]", "", row["model"].lower()).replace("llm", "")
        return next(s for s in presets if key.startswith(re.sub(r"[^a-z0-9]", "", s.name)[:10]))
    moe = row["moe"]
    for spec in presets:
        if (spec.num_layers, spec.hidden_size, spec.num_attention_heads) == (row["layers"], row["hidden"], row["heads"]) \
                and (spec.moe.num_experts if spec.moe else None) == (moe["experts"] if moe else None) \
                and (spec.position_embedding != "learned_absolute" or spec.max_position_embeddings >= row["seq_len"]):
            return spec
    return ModelSpec(
        name=row["model"], num_layers=row["layers"], hidden_size=row["hidden"], ffn_hidden_size=row["ffn_hidden"],
        num_attention_heads=row["heads"], num_query_groups=row["kv_heads"] if row["kv_heads"] != row["heads"] else None,
        vocab_size=row["vocab"] or 32000, max_position_embeddings=max(row["seq_len"], 4096),
        moe=MoESpec(num_experts=moe["experts"], router_topk=moe["topk"], moe_ffn_hidden_size=moe["moe_ffn_hidden"])
        if moe else None,
    )


def _flags(row: dict[str, Any], model: ModelSpec, tmp_path: Path) -> dict[str, Any]:
    path = tmp_path / "model.json"
    path.write_text(model.model_dump_json())
    fsdp = bool((row.get("derived") or {}).get("published_fsdp"))
    return {
        "model": str(path), "gpu": row["gpu"], "gpus": row["num_gpus"], "tp": row["tp"], "pp": row["pp"],
        "vpp": row["vp"] if row["vp"] and row["vp"] > 1 else None, "cp": row["cp"],
        "ep": row["ep"] if model.moe else None, "mbs": row["mbs"], "gbs": row["gbs"], "seq_len": row["seq_len"],
        "precision": "fp8" if "fp8" in str(row["precision"]).lower() else "bf16",
        "fsdp": fsdp or None, "distributed_optimizer": None if fsdp else True,
        "force_tp_across_nodes": True,
    }


def _split_from_fix(fix: str) -> dict[str, Any]:
    """The first split a pipeline refusal offers, as estimate flags."""
    first = fix.split("; or ")[0]
    if first.startswith("account_for"):
        return {"account_for_embedding": "account_for_embedding" in first, "account_for_loss": "account_for_loss" in first}
    if first.startswith("first_stage_layers"):
        counts = [int(n) for n in re.findall(r"=(\d+)", first)]
        return {"first_stage_layers": counts[0], "last_stage_layers": counts[1]}
    layout = re.search(r'pipeline_layout "([^"]+)"', first)
    assert layout is not None, fix
    return {"pp_layout": layout.group(1), "vpp": None}


def _retyped(refusal: MegapilotError) -> dict[str, Any]:
    """What a published table leaves out and the refusal supplies: the pipeline split, or the expert TP
    (ETP defaults to TP in Megatron; the MoE recipes set it to 1)."""
    assert "\n" not in str(refusal)
    if refusal.field == "ep":
        etps = re.search(r"set etp to one of (\d+)", refusal.fix or "")
        assert etps is not None, str(refusal)
        return {"etp": int(etps.group(1))}
    assert refusal.field in ("pp", "vpp"), str(refusal)
    assert "not divisible by pp*vpp" in refusal.problem
    return _split_from_fix(refusal.fix or "")


def _answer(flags: dict[str, Any]) -> Any:
    case = build_case(**flags)
    return estimate(case.model, case.cluster, case.training, case.parallel,
                    allow_tp_across_nodes=case.allow_tp_across_nodes)


@pytest.mark.parametrize("row", LAYOUT_ROWS, ids=[row["id"][:60] for row in LAYOUT_ROWS])
def test_each_published_layout_is_answered_or_retyped_with_the_split_the_refusal_offers(row, tmp_path):
    flags = _flags(row, _model(row), tmp_path)
    for _ in range(3):  # at most the split and the expert TP are missing
        try:
            result = _answer(flags)
            break
        except MegapilotError as refusal:
            flags |= _retyped(refusal)
    else:
        raise AssertionError(f"{row['id']}: still refused after taking each fix offered")
    assert result.tokens_per_s_per_gpu > 0 and result.step_time_s > 0


def test_the_split_rows_are_the_ones_the_issue_names():
    """126-layer 405B on PP x VPP 64 and 61-layer DeepSeek-V3 on PP 16 need a split; Llama 3 70B on PP 4 x VPP 5 not."""
    needs_split = {(row["layers"], row["pp"], row["vp"]) for row in LAYOUT_ROWS
                   if row["layers"] and row["layers"] % (row["pp"] * (row["vp"] or 1))}
    assert {(126, 8, 8), (61, 16, 1), (61, 4, 4), (94, 8, 2), (94, 8, 4)} <= needs_split
    assert (80, 4, 5) not in needs_split
