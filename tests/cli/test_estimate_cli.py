"""`megapilot estimate` through the real entry point: JSON schema, table, batch, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

LAYOUT = ("--model", "llama3.1-70b", "--gpu", "h100", "--gpus", "64", "--tp", "8", "--pp", "4",
          "--gbs", "1024", "--seq-len", "4096")


def test_json_output_has_the_stable_schema(cli):
    result = cli("estimate", *LAYOUT, "--json")
    assert result.exit_code == 0, result.stderr
    data = result.json()
    assert set(data) >= {"params", "flops_per_step", "memory_gib", "fits", "step_time_s", "tokens_per_s_per_gpu",
                         "tflops_per_gpu", "mfu", "time_breakdown_s", "warnings"}
    assert set(data["params"]) >= {"total", "active", "embedding"}
    assert set(data["memory_gib"]) >= {"weights", "gradients", "optimizer", "activations", "overhead", "total",
                                       "capacity"}
    assert data["fits"] is True and 0 < data["mfu"] < 1


def test_flags_change_the_estimate(cli):
    selective = cli("estimate", *LAYOUT, "--json").json()
    full = cli("estimate", *LAYOUT, "--recompute", "full", "--json").json()
    fp8 = cli("estimate", *LAYOUT, "--precision", "fp8", "--json").json()
    assert full["memory_gib"]["activations"] < selective["memory_gib"]["activations"]
    assert full["step_time_s"] > selective["step_time_s"] > fp8["step_time_s"]


def test_table_output_states_the_verdict_in_one_line(cli):
    result = cli("estimate", *LAYOUT)
    assert result.exit_code == 0
    first_line = result.stdout.splitlines()[0]
    assert "fits" in first_line and "GiB" in first_line
    assert "MFU" in result.stdout and "activations" in result.stdout and "pp_bubble" in result.stdout


def test_the_cluster_is_written_as_plan_writes_it(cli):
    """estimate said '64 x h100' where plan heads its table '64 × H100': one cluster, one spelling."""
    estimated = cli("estimate", *LAYOUT).stdout.splitlines()[0]
    planned = cli("plan", *LAYOUT[:6], "--gbs", "1024", "--seq-len", "4096", "--top", "1").stdout
    assert estimated.startswith("llama3.1-70b on 64 × H100: ")
    assert "llama3.1-70b on 64 × H100 — seq 4,096" in planned


def test_offload_beyond_the_host_memory_is_said_in_the_verdict(cli):
    args = ("estimate", "--model", "llama3.1-405b", "--gpu", "gb200", "--gpus", "1024", "--gbs", "1536", "--seq-len",
            "8192", "--tp", "2", "--fsdp", "--mbs", "3", "--recompute", "none", "--cpu-offloading-num-layers")
    parked = cli(*args, "105")
    assert parked.exit_code == 0 and "does NOT fit in host memory" in parked.stdout.splitlines()[0]
    assert "GiB per GPU in host memory" in parked.stdout
    data = cli(*args, "105", "--json").json()
    assert data["fits"] is False and data["host_offload_gib"] > 500 and data["memory_gib"]["total"] < 186
    assert cli(*args, "0", "--json").json()["host_offload_gib"] is None


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        (("--tp", "3"), "gpus"),
        (("--model", "not-a-model"), "model"),
        (("--gpu", "z80"), "gpu"),
        (("--precision", "fp8", "--gpu", "a100"), "precision"),
        (("--tp", "1", "--pp", "1", "--sequence-parallel"), "sequence_parallel"),
        (("--gpus", "48", "--pp", "3", "--vpp", "40"), "pp"),  # 80 layers over 120 stages: some would be empty
        (("--cp", "2", "--seq-len", "4098"), "seq_len"),
        (("--recompute", "often"), "recompute"),
    ],
)
def test_bad_input_is_one_line_exit_2(cli, extra, field):
    result = cli("estimate", *LAYOUT, *extra)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0] and "Traceback" not in result.stderr


def test_missing_required_flag_is_named(cli):
    result = cli("estimate", "--model", "llama3.1-70b", "--gpu", "h100", "--gpus", "8", "--seq-len", "4096")
    assert result.exit_code == 2 and "gbs" in result.stderr


def test_batch_returns_results_in_line_order_with_per_line_errors_and_exits_one(cli, tmp_path):
    good = {"model": "llama3.1-70b", "gpu": "h100", "gpus": 64, "tp": 8, "pp": 4, "gbs": 1024, "seq_len": 4096,
            "fsdp": False}
    lines = [json.dumps(good), json.dumps(good | {"tp": 3}), "{not json", "", json.dumps(good | {"pp": 2})]
    cases = tmp_path / "cases.jsonl"
    cases.write_text("\n".join(lines) + "\n")
    result = cli("estimate", "--batch", str(cases), "--json")
    assert result.exit_code == 1, result.stderr  # some lines failed: the exit code says so ...
    data = result.json()  # ... and the JSON still answers every line
    assert [row["line"] for row in data] == [1, 2, 3, 5]  # input line numbers: the blank line 4 is skipped
    assert data[0]["fits"] is True and "error" not in data[0]
    assert data[1]["field"] == "gpus"
    assert "not valid JSON" in data[2]["error"]
    assert data[3]["memory_gib"]["total"] > data[0]["memory_gib"]["total"]  # pp 2 holds more per GPU


def test_case_flags_beside_batch_are_refused_not_ignored(cli, tmp_path):
    cases = tmp_path / "cases.jsonl"
    cases.write_text('{"model": "llama3.1-8b", "gpu": "h100", "gpus": 8, "gbs": 64, "seq_len": 4096}\n')
    result = cli("estimate", "--batch", str(cases), "--model", "llama3.1-70b", "--tp", "8")
    assert result.exit_code == 2 and "--model, --tp would be ignored" in result.stderr
    assert cli("estimate", "--batch", str(cases), "--json").exit_code == 0


def test_batch_takes_either_key_spelling_and_echoes_each_id(cli, tmp_path):
    dashed = {"id": "dashed", "model": "llama3.1-8b", "gpu": "h100", "gpus": 8, "gbs": 64, "seq-len": 8192,
              "gpus-per-node": 8, "--tp": 2}
    snake = {"id": 7, "model": "llama3.1-8b", "gpu": "h100", "gpus": 8, "gbs": 64, "seq_len": 8192,
             "gpus_per_node": 8, "tp": 2}
    cases = tmp_path / "cases.jsonl"
    cases.write_text(json.dumps(dashed) + "\n" + json.dumps(snake) + "\n")
    result = cli("estimate", "--batch", str(cases), "--json")
    assert result.exit_code == 0, result.stdout
    first, second = result.json()
    assert (first["line"], first["id"], second["line"], second["id"]) == (1, "dashed", 2, 7)
    assert first["step_time_s"] == second["step_time_s"] and first["memory_gib"] == second["memory_gib"]
    single = cli("estimate", "--model", "llama3.1-8b", "--gpu", "h100", "--gpus", "8", "--gbs", "64",
                 "--seq-len", "8192", "--tp", "2", "--json").json()
    assert first["step_time_s"] == single["step_time_s"]  # a batch line answers as the same flags would


def test_batch_refuses_a_flag_given_in_both_spellings(cli, tmp_path):
    cases = tmp_path / "cases.jsonl"
    cases.write_text(json.dumps({"model": "tiny", "gpu": "h100", "gpus": 8, "gbs": 16, "seq_len": 128,
                                 "seq-len": 256}) + "\n")
    result = cli("estimate", "--batch", str(cases), "--json")
    assert result.exit_code == 1
    (row,) = result.json()
    assert row["field"] == "seq_len" and "twice" in row["error"] and row["line"] == 1


def test_batch_table_labels_rows_with_line_and_id(cli, tmp_path):
    cases = tmp_path / "cases.jsonl"
    cases.write_text("\n" + json.dumps({"id": "row-a", "model": "tiny", "gpu": "h100", "gpus": 8, "gbs": 16,
                                        "seq-len": 128}) + "\n" + json.dumps({"id": "row-b", "model": "tiny"}) + "\n")
    result = cli("estimate", "--batch", str(cases))
    assert result.exit_code == 1
    rows = {line.split()[1]: line for line in result.stdout.splitlines() if "row-" in line}
    assert set(rows) == {"2", "3"}  # the line numbers of the input file
    assert "row-a" in rows["2"] and "yes" in rows["2"]
    assert "row-b" in rows["3"] and "gpu: is required" in rows["3"]


def test_table_states_the_defaults_it_assumed_on_one_stderr_line(cli):
    result = cli("estimate", *LAYOUT)
    assumed = [line for line in result.stderr.splitlines() if line.startswith("assumed:")]
    assert len(assumed) == 1
    assert "MBS=1" in assumed[0] and "bf16" in assumed[0] and "no recompute" in assumed[0]
    assert "TP=" not in assumed[0] and " PP" not in assumed[0]  # given on the command line, not assumed
    given = cli("estimate", *LAYOUT, "--mbs", "2", "--precision", "fp8", "--gpus-per-node", "8")
    items = given.stderr.removeprefix("assumed: ").split(", ")
    assert "MBS" not in given.stderr and "bf16" not in items and "GPUs per node" not in given.stderr
    assert cli("estimate", *LAYOUT, "--json").stderr == ""  # JSON output is the whole answer


def test_bf16_gradients_halve_the_gradient_buffers_and_are_said_when_left_out(cli):
    fp32 = cli("estimate", *LAYOUT, "--json").json()
    bf16 = cli("estimate", *LAYOUT, "--grad-reduce-in-bf16", "--json").json()
    assert bf16["memory_gib"]["gradients"] == pytest.approx(fp32["memory_gib"]["gradients"] / 2, rel=1e-3)
    assert bf16["step_time_s"] <= fp32["step_time_s"]  # half the bytes in the DP reduce-scatter
    assert "fp32 gradients" in cli("estimate", *LAYOUT).stderr
    assert "fp32 gradients" not in cli("estimate", *LAYOUT, "--grad-reduce-in-bf16").stderr


def test_bf16_gradients_under_fp16_training_or_on_a_cpu_are_refused_by_field(cli):
    result = cli("estimate", *LAYOUT, "--precision", "fp16", "--grad-reduce-in-bf16")
    assert result.exit_code == 2 and "Traceback" not in result.stderr
    assert "grad_reduce_in_bf16" in result.stderr and "--precision bf16" in result.stderr
    tiny = ("--model", "tiny", "--gpu", "cpu", "--gpus", "2", "--gbs", "8", "--seq-len", "128", "--grad-reduce-in-bf16")
    for command in ("estimate", "plan"):  # a CPU run trains in fp32
        cpu = cli(command, *tiny)
        assert cpu.exit_code == 2 and "grad_reduce_in_bf16" in cpu.stderr and "on a CPU" in cpu.stderr
    assert "--grad-reduce-in-bf16" not in cli("estimate", *tiny[:-1]).stderr  # nor named as a default to change


def test_batch_table_and_missing_file(cli, tmp_path):
    cases = tmp_path / "cases.jsonl"
    cases.write_text(json.dumps({"model": "llama3.1-8b", "gpu": "h100", "gpus": 8, "gbs": 64, "seq_len": 8192}) + "\n")
    table = cli("estimate", "--batch", str(cases))
    assert table.exit_code == 0 and "MFU" in table.stdout
    missing = cli("estimate", "--batch", str(tmp_path / "nope.jsonl"))
    assert missing.exit_code == 2 and "batch" in missing.stderr


def test_full_attention_convention_reports_more_tflops_for_the_same_step(cli):
    causal = cli("estimate", *LAYOUT, "--json").json()
    full = cli("estimate", *LAYOUT, "--flop-convention", "megatron_full_attention", "--json").json()
    assert full["step_time_s"] == causal["step_time_s"]
    assert 1.03 < full["tflops_per_gpu"] / causal["tflops_per_gpu"] < 1.15  # Llama-70B @ 4K
    assert full["flop_convention"] == "megatron_full_attention"
    bad = cli("estimate", *LAYOUT, "--flop-convention", "hfu")
    assert bad.exit_code == 2 and "flop_convention" in bad.stderr


def test_a_tiny_model_shows_its_step_in_milliseconds_and_terms_in_microseconds_not_zero_seconds(cli):
    tiny = ("estimate", "--model", "tiny", "--gpu", "h100", "--gpus", "2", "--tp", "2", "--seq-len", "128",
            "--gbs", "16")
    result = cli(*tiny)
    assert result.exit_code == 0, result.stderr
    step_s = cli(*tiny, "--json").json()["step_time_s"]
    assert step_s < 0.05  # the case this guards: a step (its kernels' fixed costs, mostly) that "0.0 s" would hide
    from megapilot.estimate.units import format_duration

    assert f"{format_duration(step_s)}/step" in result.stdout.splitlines()[0]
    assert "µs" in result.stdout and "0.000" not in result.stdout


@pytest.mark.parametrize("args", [["--help"], ["estimate", "--help"], ["plan", "--help"]])
def test_help_loads_no_library_module_and_no_heavy_dependency(args):
    """Start-up stays fast: help is answered from the CLI modules alone (specs, catalogs, the estimator,
    YAML, Jinja2 and torch are imported inside the commands that use them). Checked in a fresh
    interpreter, since this test process has imported everything already."""
    import subprocess
    import sys

    probe = (
        "import contextlib, io, sys\n"
        "from megapilot.cli.app import main\n"
        "try:\n"
        "    with contextlib.redirect_stdout(io.StringIO()):\n"
        f"        main({args!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(' '.join(sorted(sys.modules)))\n"
    )
    loaded = set(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                                timeout=60).stdout.split())
    library = {m for m in loaded if m.startswith("megapilot.") and not m.startswith("megapilot.cli")}
    assert library <= {"megapilot.errors", "megapilot.case_flags"}  # both import nothing
    assert not loaded & {"yaml", "jinja2", "torch", "megatron", "numpy"}


def test_empty_batch_file_is_a_user_error(cli, tmp_path):
    empty = tmp_path / "cases.jsonl"
    empty.write_text("\n\n")
    result = cli("estimate", "--batch", str(empty), "--json")
    assert result.exit_code == 2 and "batch" in result.stderr


@pytest.mark.parametrize(("text", "found"), [
    (json.dumps({"version": 1, "model": {"name": "x"}, "parallel": {"tp": 8}}, indent=2),
     "one JSON object over 9 lines"),
    ("model,gpu,gpus\nllama3.1-8b,h100,8\n", "none of its 2 lines a JSON object"),
])
def test_a_file_with_no_case_on_any_line_is_one_error_not_a_row_per_line(cli, tmp_path, text, found):
    """A saved plan or a config.json passed as --batch printed a row of `not valid JSON` for each of its lines (187
    for a plan) and exited 1, as if a batch had some bad lines."""
    other = tmp_path / "plan.json"
    other.write_text(text)
    result = cli("estimate", "--batch", str(other), "--json")
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        f"error: batch: {other} is not a JSONL batch: {found} — fix: write each case as one "
        '{"model": ..., "gpu": ..., ...} object on its own line']


def test_fsdp_without_the_distributed_optimizer_is_refused_not_priced(cli, tmp_path):
    """--fsdp --no-distributed-optimizer was priced as FSDP, while the launch writes --use-distributed-optimizer
    beside --use-megatron-fsdp whatever was asked: a contradiction, refused by the field in a run or a batch line."""
    args = ["--model", "llama3.1-8b", "--gpu", "h100", "--gpus", "8", "--gbs", "1024", "--seq-len", "4096", "--fsdp"]
    result = cli("estimate", *args, "--no-distributed-optimizer")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: distributed_optimizer: --fsdp needs the distributed optimizer")
    assert cli("estimate", *args, "--json").exit_code == 0
    cases = tmp_path / "cases.jsonl"
    cases.write_text(json.dumps({"model": "llama3.1-8b", "gpu": "h100", "gpus": 8, "gbs": 1024, "seq_len": 4096,
                                 "fsdp": True, "distributed_optimizer": False}) + "\n")
    row = cli("estimate", "--batch", str(cases), "--json").json()[0]
    assert row["field"] == "distributed_optimizer"


def test_an_unset_expert_tensor_parallel_size_is_bridges_1_with_ep_and_said_so_else_it_follows_tp(cli):
    """The published MoE tables print no ETP and every Bridge MoE recipe ran 1 (Bridge's own default with EP > 1);
    Megatron-LM's TP would have priced Mixtral's experts split over TP 2, or found no legal layout at all."""
    def assumed(*layout: str) -> str:
        result = cli("estimate", "--model", "mixtral-8x7b", "--gpu", "h100", "--gpus", "16", *layout, "--gbs", "64",
                     "--seq-len", "4096")
        return next(line for line in result.stderr.splitlines() if line.startswith("assumed:"))

    with_ep = assumed("--tp", "2", "--ep", "8")
    assert "ETP=1 (Megatron-Bridge's with EP > 1" in with_ep and "None" not in with_ep
    assert "ETP=TP" in assumed("--tp", "2")  # no expert parallelism: the experts split as the dense MLP does


V4_CONFIG = Path(__file__).parents[1] / "data" / "hf_configs" / "DeepSeek-V4-Flash.json"
V4 = ("--model", str(V4_CONFIG), "--gpu", "b200", "--gpus", "256", "--gbs", "2048", "--seq-len", "4096", "--pp", "8",
      "--ep", "32", "--pp-layout", "balanced")


def test_deepseek_v4_is_estimated_with_its_mechanisms_named_and_tp_refused(cli):
    result = cli("estimate", *V4, "--json")
    assert result.exit_code == 0, result.stderr
    data = result.json()
    assert data["fits"] and data["tokens_per_s_per_gpu"] > 0
    assert any("DeepSeek-V4's attention is priced" in warning for warning in data["warnings"])
    refused = cli("estimate", *V4, "--tp", "2", "--gpus", "512")
    line, = refused.stderr.strip().splitlines()
    assert refused.exit_code == 2 and line.startswith("error: tp:") and "TP 1 only" in line


def test_layers_show_each_kind_of_layer_term_by_term(cli):
    """DeepSeek-V3 on B200: its three dense layers and 58 MoE layers are two columns, each layer term in ms, and the
    attention core's backward waits on Blackwell's shared memory."""
    moe = ("--model", "deepseek-v3", "--gpu", "b200", "--gpus", "256", "--pp", "16", "--ep", "8", "--gbs", "2048",
           "--seq-len", "4096", "--precision", "fp8", "--recompute", "none", "--first-stage-layers", "2",
           "--last-stage-layers", "3")
    table = cli("estimate", *moe, "--layers")
    assert table.exit_code == 0, table.stderr
    assert "layers 0-2" in table.stdout and "layers 3-60" in table.stdout
    assert "experts" in table.stdout and "mlp_gemms" in table.stdout
    assert "1.00 / 1.54 (shared memory)" in table.stdout
    data = cli("estimate", *moe, "--layers", "--json").json()
    dense, routed = data["layers"]
    assert dense["layers"] == [0, 1, 2] and routed["layers"] == list(range(3, 61))
    assert "experts" in routed["terms_ms"] and "experts" not in dense["terms_ms"]
    assert routed["total_ms"] == pytest.approx(sum(routed["terms_ms"].values()), abs=1e-3)
    assert routed["attention_bound"] == {"forward": 1.0, "backward": 1.5385, "backward_by": "shared memory"}
    assert "layers" not in cli("estimate", *moe, "--json").json()


def test_layers_say_a_hopper_core_is_on_its_tensor_cores_and_a_mamba_layer_has_no_softmax(cli):
    hopper = cli("estimate", *LAYOUT, "--layers", "--json").json()["layers"]
    assert len(hopper) == 1 and hopper[0]["layers"] == list(range(80))
    assert hopper[0]["attention_bound"]["backward_by"] == "tensor cores"
    hybrid = cli("estimate", "--model", "nemotron3-nano-30b-a3b", "--gpu", "gb200", "--gpus", "8", "--ep", "8",
                 "--gbs", "64", "--seq-len", "8192", "--recompute", "none", "--layers", "--json").json()["layers"]
    assert sum(len(group["layers"]) for group in hybrid) == 52
    assert any(group["attention_bound"] is None for group in hybrid)  # the Mamba mixers
    assert any(group["attention_bound"] == {"forward": 1.0, "backward": 1.6, "backward_by": "shared memory"}
               for group in hybrid)


def test_layers_refuse_a_cluster_calibration_and_a_batch(cli, tmp_path):
    result = cli("estimate", *LAYOUT, "--layers", "--cluster", "mine")
    assert result.exit_code == 2 and "--layers" in result.stderr and "Traceback" not in result.stderr
    batch = tmp_path / "cases.jsonl"
    batch.write_text(json.dumps({"model": "llama3.1-8b", "gpu": "h100", "gpus": 8, "gbs": 64, "seq-len": 4096}) + "\n")
    result = cli("estimate", "--batch", str(batch), "--layers")
    assert result.exit_code == 2 and "--layers" in result.stderr and "Traceback" not in result.stderr


def test_a_cpu_estimate_states_no_interval_and_says_what_it_leaves_out(cli):
    cpu = ("estimate", "--model", "tiny", "--gpu", "cpu", "--gpus", "2", "--gpus-per-node", "2", "--seq-len", "128",
           "--gbs", "8", "--recompute", "none")
    result = cli(*cpu)
    assert result.exit_code == 0, result.stderr
    first = result.stdout.splitlines()[0]
    assert "80 %" not in first and " 0 TFLOP/s/GPU" not in first  # a CPU's 0.1 TFLOP/s is not "0"
    assert "per-op rates" in result.stdout and "no interval is stated" in result.stdout
    payload = cli(*cpu, "--json").json()
    assert payload["tokens_per_s_per_gpu_p10"] is None and payload["tokens_per_s_per_gpu_p90"] is None


def test_cuda_graphs_on_a_cpu_are_refused_by_their_flag(cli):
    """A CPU run has no CUDA stream to capture: the graphs were priced (+0.0 %) and noted as if they ran."""
    result = cli("estimate", "--model", "tiny", "--gpu", "cpu", "--gpus", "2", "--gpus-per-node", "2", "--seq-len",
                 "128", "--gbs", "8", "--recompute", "none", "--cuda-graph-impl", "local")
    assert result.exit_code == 2 and result.stderr.startswith("error: cuda_graph_impl: "), result.stderr


HISTORY_ROWS = Path(__file__).resolve().parents[1] / "data" / "history_import" / "published_rows.jsonl"
GB200_CASE = ("estimate", "--model", "llama3.1-8b", "--gpu", "gb200", "--gpus", "16", "--seq-len", "8192", "--gbs",
              "256", "--precision", "fp8", "--cluster", "nvidia-dgx-gb200")


def test_a_cluster_calibration_is_the_one_calibration_line_and_the_published_one_is_labelled_not_used(cli, tmp_path):
    """With --cluster the published runs' 'calibration: ...' line printed beside the cluster's own: two calibration
    statements, and nothing said which the figures used. Now one calibration line (the figures'), and the other is
    said to be not used, in the text and in the JSON alike."""
    db = str(tmp_path / "history.sqlite")
    assert cli("history", "import", str(HISTORY_ROWS), "--db", db).exit_code == 0
    text = cli(*GB200_CASE, "--db", db).stdout.splitlines()
    [calibration] = [line for line in text if line.startswith("calibration:")]
    assert calibration.startswith("calibration: figures calibrated on cluster nvidia-dgx-gb200 (4 run(s)")
    [other] = [line for line in text if "published runs" in line]
    assert other.startswith("not used: the uncalibrated model's ") and text.index(other) == text.index(calibration) + 1
    document = cli(*GB200_CASE, "--db", db, "--json").json()
    assert document["calibration"] == calibration
    published = document["calibration_from_history"]["uncalibrated"]["calibration"]
    assert published.startswith("calibration: dense on GB200 fp8") and published.removeprefix("calibration: ") in other
    assert cli(*GB200_CASE, "--db", db, "--calibration", "none", "--json").json()["calibration"] == published

    # on a GPU the cluster has no run of, the published runs' calibration stays the figures' and the cluster's is
    # the one said not to be used
    elsewhere = cli(*[("h100" if arg == "gb200" else arg) for arg in GB200_CASE], "--db", db).stdout.splitlines()
    [calibration] = [line for line in elsewhere if line.startswith("calibration:")]
    assert calibration.startswith("calibration: dense on H100")
    assert elsewhere[elsewhere.index(calibration) + 1].startswith(
        "not used: cluster nvidia-dgx-gb200's calibration: no measured run on H100")


def test_the_cuda_graphs_gain_on_a_cluster_calibrated_estimate_is_the_one_its_figures_show(cli, tmp_path):
    """The note set the calibrated graphed step against the uncalibrated eager one: on GB200 it stated +15.6 % where
    the tokens/s with and without the graphs differ by 0.2 %."""
    db = str(tmp_path / "history.sqlite")
    assert cli("history", "import", str(HISTORY_ROWS), "--db", db).exit_code == 0
    eager = cli(*GB200_CASE, "--db", db, "--json").json()
    graphed = cli(*GB200_CASE, "--db", db, "--cuda-graph-impl", "transformer_engine", "--json").json()
    assert graphed["calibration"].startswith("calibration: figures calibrated on cluster")
    [note] = [note for note in graphed["notes"] if note.startswith("CUDA graphs:")]
    stated = float(note.split(" tokens/s against the same run eager")[0].rsplit(", ", 1)[1].rstrip("%"))
    shown = 100 * (graphed["tokens_per_s_per_gpu"] / eager["tokens_per_s_per_gpu"] - 1)
    assert stated == pytest.approx(shown, abs=0.06)


MIXTRAL_32 = ("estimate", "--model", "mixtral-8x7b", "--gpu", "h100", "--gpus", "32", "--tp", "2", "--pp", "2",
              "--gbs", "256", "--seq-len", "4096", "--ep", "8")


def test_experts_leaving_the_nvlink_domain_on_the_default_dispatcher_are_said_to_be_priced_so(cli):
    """plan prices the flex dispatcher where the expert group leaves the NVLink domain, estimate keeps Megatron's
    alltoall unless told: nothing had said so, so the two differed unexplained on the same layout."""
    leaving = cli(*MIXTRAL_32, "--etp", "2").stdout.splitlines()
    [note] = [line for line in leaving if line.startswith("dispatcher:")]
    assert "(EP 8 x ETP 2 = 16 GPUs) leaves the 8-GPU NVLink domain" in note
    assert "alltoall" in note and "--moe-flex-dispatcher deepep" in note
    flex = cli(*MIXTRAL_32, "--etp", "2", "--moe-flex-dispatcher", "deepep")  # the flag it names prices it
    assert not any(line.startswith("dispatcher:") for line in flex.stdout.splitlines())
    assert flex.stdout.splitlines()[0] != leaving[0]
    inside = cli(*MIXTRAL_32, "--etp", "1").stdout  # 8 GPUs: inside the node, both dispatchers alike
    assert "dispatcher:" not in inside
    assert "--moe-a2a-overlap" not in note  # PP 2 without VPP: Megatron refuses the overlap on this layout


def test_experts_leaving_the_domain_name_the_all_to_all_overlap_where_megatron_allows_it(cli):
    """The recipes that spread experts over nodes run the flex dispatcher and the all-to-all overlap together (the
    25.09 DeepSeek-V3 one on 1,024 H100: 36 % slow as typed, both off); the note names both flags."""
    flat = ("estimate", "--model", "mixtral-8x7b", "--gpu", "h100", "--gpus", "32", "--tp", "2", "--ep", "8",
            "--etp", "2", "--gbs", "256", "--seq-len", "4096")
    [note] = [line for line in cli(*flat).stdout.splitlines() if line.startswith("dispatcher:")]
    assert "--moe-flex-dispatcher deepep" in note and "--moe-a2a-overlap hides what is left" in note
    told = cli(*flat, "--moe-a2a-overlap").stdout.splitlines()
    assert not any("--moe-a2a-overlap hides" in line for line in told)


def test_the_overlap_is_not_named_beside_graphs_megatron_refuses_it_with_and_is_refused_there(cli):
    """Megatron asserts 'CUDA graph scope on moe and mlp is not supported with overlap_moe_expert_parallel_comm':
    the note named the overlap beside Transformer Engine's mlp graphs, and estimate priced the two together."""
    deepseek = ("estimate", "--model", "deepseek-v3", "--gpu", "h100", "--gpus", "1024", "--tp", "2", "--pp", "8",
                "--vpp", "4", "--ep", "64", "--etp", "1", "--gbs", "8192", "--seq-len", "4096", "--pp-layout",
                "balanced", "--cuda-graph-impl", "transformer_engine")
    attn = cli(*deepseek, "--cuda-graph-scope", "attn")
    [note] = [line for line in attn.stdout.splitlines() if line.startswith("dispatcher:")]
    assert "--moe-a2a-overlap hides" in note
    mlp = cli(*deepseek, "--cuda-graph-scope", "attn mlp")  # the three dense layers' MLPs
    assert mlp.exit_code == 0, mlp.stderr
    [note] = [line for line in mlp.stdout.splitlines() if line.startswith("dispatcher:")]
    assert "--moe-flex-dispatcher deepep" in note and "--moe-a2a-overlap" not in note
    refused = cli(*deepseek, "--cuda-graph-scope", "attn mlp", "--moe-a2a-overlap")
    assert refused.exit_code == 2 and refused.stderr.startswith("error: cuda_graph_scope: ")
    assert "the mlp scope is not captured beside the expert all-to-all overlap" in refused.stderr


QWEN3_GB200 = ("estimate", "--model", "qwen3-30b-a3b", "--gpu", "gb200", "--gpus", "8", "--ep", "8", "--gbs", "512",
               "--seq-len", "4096", "--mbs", "4", "--precision", "fp8")


def test_cuda_graphs_are_priced_and_said_and_a_scope_megatron_refuses_is_one_error(cli):
    # the GB200 recipes' graphs, beside the HybridEP dispatcher they run
    eager = cli(*QWEN3_GB200, "--moe-flex-dispatcher", "hybridep", "--json").json()
    graphed = cli(*QWEN3_GB200, "--moe-flex-dispatcher", "hybridep", "--cuda-graph-impl", "transformer_engine",
                  "--cuda-graph-scope", "attn moe_router moe_preprocess", "--json").json()
    assert graphed["tokens_per_s_per_gpu"] > eager["tokens_per_s_per_gpu"]
    alltoall = cli(*QWEN3_GB200, "--cuda-graph-impl", "transformer_engine", "--cuda-graph-scope",
                   "attn moe_router moe_preprocess")  # FP8 experts' padded counts go to the host there
    assert alltoall.exit_code == 2 and "the router's padding for quantised experts" in alltoall.stderr
    text = cli(*QWEN3_GB200, "--cuda-graph-impl", "transformer_engine", "--cuda-graph-scope", "attn").stdout
    [note] = [line for line in text.splitlines() if line.startswith("CUDA graphs:")]
    assert "transformer_engine over attn" in note and "tokens/s against the same run eager" in note
    assert "not in the memory figure" in note
    refused = cli(*QWEN3_GB200, "--cuda-graph-impl", "transformer_engine")  # a whole dropless MoE layer
    assert refused.exit_code == 2 and refused.stderr.startswith("error: cuda_graph_scope: CUDA graphs ")
    assert "Traceback" not in refused.stderr


def test_a_layout_wrong_whatever_its_split_is_refused_for_that_not_for_the_split(cli):
    """DeepSeek-V3's 61 layers over PP 16 with TP 2, EP 64 and ETP 2 on 1,024 GPUs: EP x ETP = 128 exceeds a
    stage's 64 ranks. Asking for a pipeline split (which the balanced one would give) hid that: the user who passed
    one met the EP error next."""
    args = ("--model", "deepseek-v3", "--gpu", "h100", "--gpus", "1024", "--tp", "2", "--pp", "16", "--ep", "64",
            "--gbs", "8192", "--seq-len", "4096")
    refused = cli("estimate", *args, "--etp", "2")
    assert refused.exit_code == 2 and refused.stderr.startswith("error: ep: ep*etp = 64*2"), refused.stderr
    assert cli("estimate", *args, "--json").exit_code == 0  # with ETP 1, the default, the balanced split is priced


def test_a_layout_whose_layers_do_not_divide_over_the_pipeline_is_priced_balanced_and_says_so(cli):
    """A published table prints Qwen3-235B's PP 8 without the split its recipe set (94 layers): estimate prices
    the balanced split and names it; script, which writes the command line, still asks for one."""
    args = ("--model", "qwen3-235b-a22b", "--gpu", "gb200", "--gpus", "64", "--pp", "8", "--ep", "8", "--gbs",
            "1024", "--seq-len", "4096", "--precision", "fp8")
    text = cli("estimate", *args)
    assert text.exit_code == 0, text.stderr
    assert "pipeline layout Et*12|(t*12|)*6t*10L: the balanced split, as none was given" in text.stderr
    priced = cli("estimate", *args, "--json").json()
    assert priced["pipeline_split"] == "Et*12|(t*12|)*6t*10L"
    asked = cli("estimate", *args, "--pp-layout", "balanced", "--json").json()
    assert {**priced, "defaults": None} == {**asked, "defaults": None}
    assert any("the balanced split, as none was given" in said for said in priced["defaults"])  # --json says it too
    assert not any("balanced split" in said for said in asked["defaults"])
    given = cli("estimate", *args, "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split")
    assert given.exit_code == 0 and "the balanced split" not in given.stderr  # a split given is the one priced
    short = cli("estimate", *args, "--account-for-embedding-in-pipeline-split")  # 95 slots over 8: still refused
    assert short.exit_code == 2 and "no pipeline split is given" in short.stderr, short.stderr
    script = cli("script", *args, "--mock-data", "--megatron-path", "/opt/Megatron-LM", "--remote")
    assert script.exit_code == 2 and "no pipeline split is given" in script.stderr
