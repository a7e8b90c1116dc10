from __future__ import annotations

import json
import re
from decimal import Decimal
from pathlib import Path

import pytest

from megapilot.catalog import get_model, get_preset, list_models, load_hf_config, load_presets
from megapilot.catalog.models import lookup_key
from megapilot.errors import MegapilotError
from megapilot.estimate.params import count_params

HF_CONFIGS = Path(__file__).parents[1] / "data" / "hf_configs"

REQUIRED_PRESETS = [
    "llama3.1-8b", "llama3.1-70b", "llama3.1-405b", "llama3.3-70b", "llama2-7b", "llama2-13b", "llama2-70b",
    "mixtral-8x7b", "mixtral-8x22b", "deepseek-v2-lite", "deepseek-v3", "qwen3-30b-a3b", "qwen3-235b-a22b",
    "nemotron4-340b", "gpt3-175b", "gpt-1.7b", "gpt-3.6b", "gpt-7.5b", "gpt-18.4b", "gpt-39.1b", "gpt-76.1b",
    "gpt-145.6b", "gpt-310.1b", "gpt-529.6b", "gpt-1t", "gpt-22b", "tiny",
    "gpt-oss-20b", "gpt-oss-120b", "llama4-scout-17b-16e", "llama4-maverick-17b-128e", "kimi-k2", "phi3-mini",
    "phi3-medium", "qwen2.5-7b", "qwen2.5-72b", "nemotron3-nano-30b-a3b", "nemotron-h-8b", "nemotron-h-56b",
]

# preset → vendored HF config of the same model.
HF_TWINS = {
    "llama3.1-8b": "Llama-3.1-8B", "llama3.1-70b": "Llama-3.1-70B", "llama3.1-405b": "Llama-3.1-405B",
    "mixtral-8x7b": "Mixtral-8x7B-v0.1", "deepseek-v2-lite": "DeepSeek-V2-Lite", "deepseek-v3": "DeepSeek-V3",
    "qwen3-30b-a3b": "Qwen3-30B-A3B", "gpt2-124m": "gpt2", "deepseek-v3.2": "DeepSeek-V3.2", "glm-5": "GLM-5",
    "nemotron3-super-120b-a12b": "NVIDIA-Nemotron-3-Super-120B-A12B-BF16",
    "llama3.3-nemotron-super-49b": "Llama-3_3-Nemotron-Super-49B-v1", "deepseek-v4-flash": "DeepSeek-V4-Flash",
}
# Training settings rather than architecture: a config.json may leave them to the library's default.
NOT_ARCHITECTURE = {"name", "aux_loss_coeff", "load_balancing_type"}


def test_catalog_has_the_required_presets_with_sources():
    presets = load_presets()
    assert set(REQUIRED_PRESETS) <= set(presets)
    assert all(preset.source for preset in presets.values())
    assert [spec.name for spec in list_models()] == list(presets)


def test_preset_names_are_lowercase_dashes_and_lookup_keys_never_collide():
    keys: dict[str, str] = {}
    for name, preset in load_presets().items():
        assert re.fullmatch(r"[a-z0-9][a-z0-9.\-]*", name), name
        for key in preset.lookup_keys:
            assert keys.setdefault(key, name) == name, f"{name} and {keys[key]} share the key {key}"


def _half_unit_of_last_digit(value: float) -> float:
    exponent = Decimal(repr(value)).normalize().as_tuple().exponent
    return 0.5 * 10.0 ** min(int(exponent), 0) if not float(value).is_integer() else 0.5


@pytest.mark.parametrize("name", [n for n, p in load_presets().items() if p.published_params_b is not None])
def test_preset_counts_match_the_size_its_publisher_states(name):
    preset = load_presets()[name]
    published = preset.published_params_b
    counted_b = (count_params(preset.spec).main_model + preset.published_extra_params) / 1e9
    # Published sizes are rounded: allow half a unit of their last digit, and never less than 0.5 %.
    assert abs(counted_b - published) <= max(0.005 * published, _half_unit_of_last_digit(published))


@pytest.mark.parametrize("name", [n for n, p in load_presets().items() if p.published_active_params_b is not None])
def test_preset_active_counts_match_the_active_size_its_publisher_states(name):
    preset = load_presets()[name]
    published = preset.published_active_params_b
    counts = count_params(preset.spec)
    counted = counts.active if preset.published_active_counts_input_embedding else counts.active_without_input_embedding
    assert abs(counted / 1e9 - published) <= max(0.005 * published, _half_unit_of_last_digit(published))


def test_active_conventions_differ_between_publishers():
    # Each stated active size fits one convention only: a test that would pass either way checks nothing.
    for name in ("llama4-scout", "gpt-oss-20b", "kimi-k2", "deepseek-v3", "deepseek-v4-flash"):
        preset = get_preset(name)
        counts = count_params(preset.spec)
        published = preset.published_active_params_b
        fits = [abs(c / 1e9 - published) <= _half_unit_of_last_digit(published)
                for c in (counts.active, counts.active_without_input_embedding)]
        assert fits == [preset.published_active_counts_input_embedding,
                        not preset.published_active_counts_input_embedding], name


@pytest.mark.parametrize("preset_name", sorted(HF_TWINS))
def test_preset_equals_its_hugging_face_config(preset_name):
    preset = get_model(preset_name)
    imported = load_hf_config(HF_CONFIGS / f"{HF_TWINS[preset_name]}.json")

    def architecture(spec) -> dict:
        dump = spec.model_dump()
        if dump["moe"]:
            dump["moe"] = {k: v for k, v in dump["moe"].items() if k not in NOT_ARCHITECTURE}
        return {k: v for k, v in dump.items() if k not in NOT_ARCHITECTURE}

    assert architecture(preset) == architecture(imported)
    assert count_params(preset) == count_params(imported)


def test_nemotron4_340b_matches_the_reports_embedding_split():
    counts = count_params(get_model("nemotron4-340b"))
    assert counts.embedding + counts.output_layer == pytest.approx(9.4e9, rel=0.01)
    assert counts.layers + counts.final_norm == pytest.approx(331.6e9, rel=0.001)
    assert get_model("nemotron4-340b").mlp_activation == "squared_relu"


def test_tiny_preset_is_the_cpu_trainers_gpt():
    tiny = get_model("tiny")
    assert (tiny.num_layers, tiny.hidden_size, tiny.num_attention_heads, tiny.ffn_hidden_size) == (4, 128, 4, 512)
    assert tiny.max_position_embeddings >= 128 and tiny.padded_vocab_size(2) == tiny.vocab_size == 1024


# ---- resolution ---------------------------------------------------------------------------------


@pytest.mark.parametrize("spelling", ["llama3.1-8b", "Llama-3.1-8B", "LLAMA3_1_8B", "llama3.1_8b", "llama3-8b"])
def test_lookup_is_case_and_separator_tolerant_and_knows_aliases(spelling):
    assert get_model(spelling).name == "llama3.1-8b"


def test_get_preset_returns_none_for_unknown_names():
    assert get_preset("gpt-530b").spec.name == "gpt-529.6b"
    assert get_preset("no-such-model") is None
    assert lookup_key("Llama-3.1 8B") == "llama318b"


def test_unknown_name_suggests_close_presets():
    with pytest.raises(MegapilotError) as excinfo:
        get_model("llama3.1-9b")
    error = excinfo.value
    assert error.field == "model" and "llama3.1-8b" in error.fix and "config.json" in error.fix


def test_paths_to_hf_configs_resolve(tmp_path):
    assert get_model(str(HF_CONFIGS / "gpt2.json")).hf_architecture == "GPT2LMHeadModel"
    folder = tmp_path / "Qwen3-30B-A3B"
    folder.mkdir()
    (folder / "config.json").write_text((HF_CONFIGS / "Qwen3-30B-A3B.json").read_text())
    assert get_model(str(folder)).name == "Qwen3-30B-A3B"
    assert get_model(str(folder / "config.json")).moe is not None


def test_modelspec_files_in_yaml_and_json_resolve(tmp_path):
    fields = {"num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 256, "num_attention_heads": 4,
              "vocab_size": 1000}
    (tmp_path / "mine.json").write_text(json.dumps(fields))
    assert get_model(str(tmp_path / "mine.json")).name == "mine"
    (tmp_path / "other.yaml").write_text("name: other\n" + "".join(f"{k}: {v}\n" for k, v in fields.items()))
    assert get_model(str(tmp_path / "other.yaml")).hidden_size == 64


def test_a_saved_plan_gives_the_model_it_was_planned_for(tmp_path):
    """`--model plan.json` (what `plan --save` wrote): its model, not a refusal of its other keys as model fields."""
    from megapilot.catalog.gpus import cluster_of
    from megapilot.plan.planner import plan
    from megapilot.spec import TrainingSpec

    model = get_preset("qwen3-30b-a3b").spec
    saved = plan(model, cluster_of("h100", 16, None), TrainingSpec(seq_length=4096, global_batch_size=64),
                 top=1).to_saved_plan()
    (tmp_path / "plan.json").write_text(saved.model_dump_json())
    assert get_model(str(tmp_path / "plan.json")) == model


def test_bad_model_files_are_user_errors_naming_the_field(tmp_path):
    (tmp_path / "bad.yaml").write_text("num_layers: [unclosed\n")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    (tmp_path / "typo.yaml").write_text("num_layer: 2\nhidden_size: 64\n")
    for name in ("bad.yaml", "list.yaml", "missing.yaml"):
        with pytest.raises(MegapilotError) as excinfo:
            get_model(str(tmp_path / name))
        assert excinfo.value.field == "model"
    with pytest.raises(MegapilotError) as excinfo:
        get_model(str(tmp_path / "typo.yaml"))
    assert excinfo.value.field.startswith("model.")


@pytest.mark.parametrize(("change", "field", "fix"), [
    ({"num_layers": 0}, "model.num_layers", "set num_layers in {path}"),
    ({"hidden_size": 10**30}, "model.hidden_size", "set hidden_size in {path}"),
    ({"num_attention_heads": 3}, "model", "make the fields of {path} agree"),
    ({"num_layer": 2}, "model.num_layer", "remove num_layer from {path}"),
])
def test_a_refused_modelspec_file_says_what_to_change_in_it(tmp_path, change, field, fix):
    # the refusal named the field but gave no fix ("model.num_layers: Input should be greater than 0")
    fields = {"num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 256, "num_attention_heads": 4,
              "vocab_size": 1000}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(fields | change))
    with pytest.raises(MegapilotError) as excinfo:
        get_model(str(path))
    assert excinfo.value.field == field and fix.format(path=path) in (excinfo.value.fix or "")


def test_a_hf_config_without_model_type_is_read_as_one_not_as_modelspec_fields(tmp_path):
    config = json.loads((HF_CONFIGS / "Llama-3.1-8B.json").read_text())
    del config["model_type"], config["architectures"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(MegapilotError) as excinfo:  # it read as a ModelSpec file: "model.num_layers: Field required"
        get_model(str(tmp_path / "config.json"))
    assert excinfo.value.field == "model_type" and '"model_type"' in (excinfo.value.fix or "")


# ---- CLI ------------------------------------------------------------------------------------------


def test_cli_models_json_lists_every_preset_with_counts(cli):
    result = cli("models", "--json")
    assert result.exit_code == 0
    rows = {row["name"]: row for row in result.json()}
    assert list(rows) == list(load_presets())
    v3 = rows["deepseek-v3"]
    assert v3["params"]["main_model"] == 671_026_419_200 and v3["params"]["active"] == 37_552_297_472
    assert (v3["num_experts"], v3["router_topk"], v3["attention"]) == (256, 8, "MLA")
    assert rows["llama3.1-70b"]["kv_heads"] == 8 and rows["llama3.1-70b"]["spec"]["num_layers"] == 80


def test_cli_models_table_shows_presets(cli):
    result = cli("models")
    assert result.exit_code == 0
    assert "mixtral-8x22b" in result.stdout and "256/8" in result.stdout and "671.0" in result.stdout


def test_cli_models_one_model_from_a_config(cli):
    result = cli("models", str(HF_CONFIGS / "Mixtral-8x7B-v0.1.json"), "--json")
    assert result.exit_code == 0 and result.json()["params"]["active"] == 12_879_925_248


def test_cli_unknown_model_exits_2_on_one_line(cli):
    result = cli("models", "llama9-1t")
    assert result.exit_code == 2
    assert "model" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_cli_a_bad_hf_config_value_exits_2_on_one_line_naming_the_field(cli, tmp_path):
    config = json.loads((HF_CONFIGS / "Llama-3.1-8B.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"rope_theta": "abc"}))
    result = cli("models", str(tmp_path / "config.json"))
    assert result.exit_code == 2 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "rope_theta" in result.stderr


def test_cli_one_model_table_shows_its_exact_breakdown(cli):
    result = cli("models", str(HF_CONFIGS / "gpt2.json"))
    assert result.exit_code == 0
    assert "124,439,808" in result.stdout and f"{(50_257 + 1024) * 768:,}" in result.stdout


def test_kimi_k2_count_against_its_three_published_sizes():
    preset = get_preset("kimi-k2")
    counts = count_params(preset.spec)
    assert abs(counts.main_model / 1.03e12 - 1) < 0.005  # the Hub's 1.03T (and the card's "1T")
    # The card's 32B active is the count without the input embedding, as DeepSeek-V2-Lite's 2.4B is.
    assert round(counts.active_without_input_embedding / 1e9) == 32 != round(counts.active / 1e9)
    # The report's 1.04T is 1.3 % above the released model; with one MTP module (not in the released config)
    # the count is 1.0436T.
    assert abs(counts.main_model / 1.04e12 - 1) > 0.01
    with_mtp = count_params(preset.spec.model_copy(update={"mtp_num_layers": 1}))
    assert abs(with_mtp.total / 1.04e12 - 1) < 0.005 and preset.spec.mtp_num_layers == 0


NEWER_FAMILIES = ["gpt-oss-20b", "gpt-oss-120b", "llama4-scout", "llama4-maverick", "kimi-k2", "phi3-mini",
                  "phi3-medium", "qwen2.5-7b", "qwen2.5-72b", "nemotron3-nano", "nemotron-h-8b", "nemotron-h-56b"]


@pytest.mark.parametrize(("name", "gpu", "precision"), [
    *[(name, "h100", "bf16") for name in NEWER_FAMILIES],
    ("nemotron-h-8b", "gb200", "nvfp4"), ("gpt-oss-20b", "mi355x", "mxfp8"), ("kimi-k2", "b300", "fp8"),
])
def test_estimate_answers_for_each_newer_family(cli, name, gpu, precision):
    result = cli("estimate", "--model", name, "--gpu", gpu, "--gpus", "8", "--gbs", "8", "--seq-len", "4096",
                 "--precision", precision, "--json")
    assert result.exit_code == 0, result.stderr
    estimate = result.json()
    assert estimate["params"]["total"] == count_params(get_model(name)).total
    assert estimate["step_time_s"] > 0 and 0 < estimate["mfu"] < 1
