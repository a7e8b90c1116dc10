"""`--cp-comm-type` on `estimate`, `plan` and `script`: a2a estimated and written, a bad value one line, exit 2."""

from __future__ import annotations

GPT_OSS_CP2 = ("--model", "gpt-oss-120b", "--gpu", "h100", "--gpus", "64", "--tp", "2", "--cp", "2", "--ep", "8",
               "--etp", "1", "--fsdp", "--gbs", "64", "--seq-len", "32768")


def test_gpt_oss_at_cp_2_is_refused_on_the_ring_and_estimated_by_a2a(cli):
    ring = cli("estimate", *GPT_OSS_CP2, "--cp-comm-type", "p2p", "--json")
    assert ring.exit_code == 2 and len(ring.stderr.strip().splitlines()) == 1
    assert "cp_comm_type" in ring.stderr and "--cp-comm-type a2a" in ring.stderr
    a2a = cli("estimate", *GPT_OSS_CP2, "--cp-comm-type", "a2a", "--json")
    assert a2a.exit_code == 0, a2a.stderr
    assert a2a.json()["time_breakdown_s"]["cp_comm"] > 0
    # left out, the exchange Transformer Engine runs sinks by is taken (as the planner takes it) and said
    default = cli("estimate", *GPT_OSS_CP2)
    assert default.exit_code == 0 and "a2a CP (attention sinks or a sliding window" in default.stderr
    taken = cli("estimate", *GPT_OSS_CP2, "--json").json()
    assert {**taken, "defaults": None} == {**a2a.json(), "defaults": None}
    assert any("a2a CP (attention sinks" in said for said in taken["defaults"])  # --json says it was taken too


def test_an_unpriced_or_unknown_exchange_is_one_line_naming_the_field(cli):
    for value in ("all_gather", "ring"):
        for command in ("estimate", "plan"):
            result = cli(command, *GPT_OSS_CP2[:6], "--gbs", "64", "--seq-len", "32768", "--cp", "2",
                         "--cp-comm-type", value)
            assert result.exit_code == 2, (command, value)
            assert len(result.stderr.strip().splitlines()) == 1 and "cp_comm_type" in result.stderr


def test_script_writes_the_flag_for_an_a2a_layout(cli, tmp_path):
    model = tmp_path / "gpt-oss-120b.json"  # at its original context: pretrain_gpt.py builds YaRN only for MLA
    from megapilot.catalog import get_model

    model.write_text(get_model("gpt-oss-120b").model_copy(update={"rope_scaling": None}).model_dump_json())
    out = tmp_path / "train.sh"
    result = cli("script", "--model", str(model), *GPT_OSS_CP2[2:], "--cp-comm-type", "a2a", "--mock-data",
                 "--megatron-path", "/opt/Megatron-LM", "-o", str(out))
    assert result.exit_code == 0, result.stderr
    assert "--cp-comm-type a2a" in out.read_text()
