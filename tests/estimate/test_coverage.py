"""Every estimate knows which published runs stand behind it; a case outside all of them says so."""

from __future__ import annotations

import pytest

from megapilot.catalog import get_gpu, get_model
from megapilot.estimate import build_case, estimate
from megapilot.estimate.coverage import (
    EXPONENTIAL_BOUND,
    CoverageCell,
    band_for,
    calibrated_cells,
    checked_mechanisms,
    coverage_for,
    error_band,
    mechanisms,
    nearest_coverage,
    with_mechanisms,
)


def test_a_calibrated_cell_states_its_runs_and_median_error():
    coverage = coverage_for(get_model("llama3.1-70b"), get_gpu("h100"), "fp8")
    assert coverage.exact and not coverage.outside
    assert coverage.nearest is not None and coverage.nearest.runs >= 10
    assert "calibrated (" in coverage.statement() and "median |error|" in coverage.statement()


def test_an_fp16_estimate_names_fp16_and_the_bf16_runs_it_is_priced_on():
    statement = coverage_for(get_model("llama3.1-70b"), get_gpu("h100"), "fp16").statement()
    # the line said "bf16" alone, and an FP16 estimate read as a BF16 one
    assert "dense on H100-SXM5-80GB fp16 (priced as bf16" in statement
    assert "no published run is fp16" in statement
    assert "fp16" not in coverage_for(get_model("llama3.1-70b"), get_gpu("h100"), "bf16").statement()


def test_an_uncalibrated_nvidia_gpu_names_the_nearest_calibrated_cell_of_its_own_generation():
    coverage = coverage_for(get_model("llama3.1-70b"), get_gpu("h200"), "bf16")
    assert not coverage.exact and not coverage.outside
    # the A100 cell has more runs; the H200 is a Hopper, as the H100 is
    assert "nearest: dense on H100-SXM5-80GB bf16" in coverage.statement()


def test_an_uncalibrated_precision_leans_on_its_own_gpu_before_a_busier_cell_elsewhere():
    coverage = coverage_for(get_model("mixtral-8x7b"), get_gpu("h100"), "bf16")
    assert coverage.nearest is not None and not coverage.exact
    assert (coverage.nearest.gpu, coverage.nearest.precision) == ("H100-SXM5-80GB", "fp8")


def test_amd_and_hybrid_models_lie_outside_every_calibrated_family_and_the_estimate_says_so():
    case = build_case(model="llama3.1-70b", gpu="mi300x", gpus=64, tp=8, pp=2, gbs=512, seq_len=8192)
    result = estimate(case.model, case.cluster, case.training, case.parallel)
    assert any(w.startswith("calibration: no published run") and "MI300X" in w for w in result.warnings)
    assert coverage_for(get_model("nemotron3-nano"), get_gpu("h100"), "bf16").outside
    nvidia = build_case(model="llama3.1-70b", gpu="h100", gpus=64, tp=8, pp=2, gbs=512, seq_len=8192)
    assert not any(w.startswith("calibration:") for w in
                   estimate(nvidia.model, nvidia.cluster, nvidia.training, nvidia.parallel).warnings)


def test_the_cells_cover_both_calibration_files():
    cells = {(c.family, c.gpu, c.precision) for c in calibrated_cells()}
    assert ("dense", "A100-SXM4-80GB", "bf16") in cells  # papers (in-sample)
    assert ("moe", "GB200", "fp8") in cells  # Megatron-Bridge 25.09 (held out by release)
    assert all(c.runs > 0 and 0 <= c.median_abs_error < 1 for c in calibrated_cells())


def test_four_bit_formats_lean_on_the_8_bit_fit_and_every_estimate_says_where_it_stands():
    llama = get_model("llama3.1-8b")
    nvfp4 = coverage_for(llama, get_gpu("b200"), "nvfp4")
    assert nvfp4.precision == "fp4" and nvfp4.needs_caveat and not nvfp4.outside
    assert (nvfp4.nearest.gpu, nvfp4.nearest.precision) == ("B200", "fp8")  # same GPU, the fit it leans on
    assert nvfp4.unchecked_mechanisms == ("NVFP4 GEMMs",)
    assert "no published run has NVFP4 GEMMs" in nvfp4.statement()
    assert "1.42x FP8's rate" in nvfp4.statement()  # its GEMM rate rests on TE's measured layer, not the datasheet
    fp8 = coverage_for(llama, get_gpu("b200"), "mxfp8")  # the 25.07 / 25.09 tables' parenthesized MXFP8 runs
    assert fp8.precision == "fp8" and not fp8.needs_caveat
    flags = {"model": "llama3.1-8b", "gpu": "b200", "gpus": 8, "gbs": 128, "seq_len": 8192}
    for precision, caveat in (("bf16", False), ("fp8", False), ("nvfp4", True)):
        case = build_case(**flags, precision=precision)
        result = estimate(case.model, case.cluster, case.training, case.parallel)
        assert result.calibration.startswith("calibration: ")
        assert (result.calibration in result.warnings) is caveat


def test_a_4_bit_estimate_outside_every_cell_still_says_what_its_gemm_rate_rests_on():
    # MXFP4 runs only on MI355X, where no published run is: the caveat is the outside one, and its GEMM rate (the
    # datasheet's 4-bit peak at the 8-bit fit) is as unmeasured as NVFP4's beside a cell
    mxfp4 = coverage_for(get_model("llama3.1-70b"), get_gpu("mi355x"), "mxfp4")
    assert mxfp4.outside
    assert "MXFP4 GEMMs are priced at the datasheet's 4-bit peak" in mxfp4.statement()
    assert "4-bit peak" not in coverage_for(get_model("llama3.1-70b"), get_gpu("mi355x"), "mxfp8").statement()


def test_a_cell_states_which_way_its_estimates_leaned_only_when_the_lean_is_a_pattern():
    def cell(median_abs: float, median_signed: float) -> CoverageCell:
        return CoverageCell("moe", "B200", "fp8", 5, median_abs, median_signed)

    assert cell(0.18, 0.18).lean() == ", throughput predicted high: median +18.0 %"
    assert cell(0.066, -0.049).lean() == ", throughput predicted low: median -4.9 %"
    assert cell(0.107, -0.023).lean() == ""  # mixed signs around one outlier: the median sits near zero
    assert cell(0.02, 0.02).lean() == ""  # within any cell's spread
    for calibrated in calibrated_cells():  # the committed cells: every estimate's line carries its lean
        statement = coverage_for_cell(calibrated).statement()
        assert statement.endswith(calibrated.lean() + ")"), statement


def coverage_for_cell(cell: CoverageCell):
    from megapilot.estimate.coverage import CalibrationCoverage

    return CalibrationCoverage(cell.family, cell.gpu, cell.precision, cell, exact=True)


def test_the_interval_is_the_held_out_spread_of_the_cell_and_wider_outside_it():
    from megapilot.estimate.coverage import CalibrationCoverage, error_band

    spread = tuple(0.01 * i - 0.1 for i in range(21))  # -10 % .. +10 %
    cell = CoverageCell("dense", "H100-SXM5-80GB", "fp8", 10, 0.05, 0.0, spread)
    cells = (cell,)
    own = error_band(cells, CalibrationCoverage("dense", "H100-SXM5-80GB", "fp8", cell, True))
    # 21 errors: the split-conformal ends are the 2nd and the 20th, floor(22 x 0.1) and ceil(22 x 0.9)
    assert own.p10_error == pytest.approx(-0.09, abs=0.001) and own.p90_error == pytest.approx(0.09, abs=0.001)
    nearest = error_band(cells, CalibrationCoverage("dense", "H200", "fp8", cell, False))
    outside = error_band(cells, CalibrationCoverage("dense", "MI300X", "fp8", None, False))
    assert nearest.p10_error < own.p10_error and nearest.p90_error > own.p90_error
    assert outside.p10_error < nearest.p10_error and outside.p90_error > nearest.p90_error
    assert "widened" in outside.basis
    low, high = own.tokens_interval(1000.0)
    assert low < 1000.0 < high  # an estimate that runs high has its truth below it: p10 divides by 1 + p90 error


def test_the_conformal_ends_are_order_statistics_clamped_to_the_sample():
    from megapilot.estimate.coverage import conformal_bounds

    assert conformal_bounds([3.0, 1.0, 2.0]) == (1.0, 3.0)  # ranks 0 and 4 of 3 values: the extremes
    assert conformal_bounds([float(i) for i in range(1, 10)]) == (1.0, 9.0)  # n = 9: exactly the extremes
    assert conformal_bounds([float(i) for i in range(1, 22)]) == (2.0, 20.0)  # n = 21: floor(2.2), ceil(19.8)


def test_the_80_percent_interval_of_a_small_sample_holds_the_next_error_80_percent_of_the_time():
    """A cell of 9 runs (18 held-out errors): the interpolated 10th / 90th percentiles hold the next error about
    73 % of the time; the split-conformal order statistics (here the extremes) at least 80 %."""
    import math
    import random

    from megapilot.estimate.coverage import CalibrationCoverage, error_band

    draw = random.Random(31)
    trials, inside = 2000, 0
    for _ in range(trials):
        errors = tuple(math.expm1(draw.gauss(0.0, 0.2)) for _ in range(18))
        cell = CoverageCell("dense", "H100-SXM5-80GB", "bf16", 9, 0.1, 0.0, errors)
        band = error_band((cell,), CalibrationCoverage("dense", "H100-SXM5-80GB", "bf16", cell, True))
        inside += band.p10_error <= math.expm1(draw.gauss(0.0, 0.2)) <= band.p90_error
    assert 0.8 <= inside / trials <= 0.95


def test_every_estimate_carries_its_80_percent_interval_around_the_prediction():
    case = build_case(model="llama3.1-70b", gpu="h100", gpus=64, tp=4, pp=4, gbs=512, seq_len=8192,
                      precision="fp8")
    result = estimate(case.model, case.cluster, case.training, case.parallel)
    assert result.tokens_per_s_per_gpu_p10 is not None and result.tokens_per_s_per_gpu_p90 is not None
    assert result.tokens_per_s_per_gpu_p10 < result.tokens_per_s_per_gpu < result.tokens_per_s_per_gpu_p90
    assert result.interval_basis and "held-out errors" in result.interval_basis
    amd = build_case(model="llama3.1-70b", gpu="mi300x", gpus=64, tp=8, pp=2, gbs=512, seq_len=8192)
    wide = estimate(amd.model, amd.cluster, amd.training, amd.parallel)
    assert wide.tokens_per_s_per_gpu_p90 / wide.tokens_per_s_per_gpu_p10 > \
        result.tokens_per_s_per_gpu_p90 / result.tokens_per_s_per_gpu_p10



def test_every_committed_cell_carries_its_runs_held_out_errors_by_family_and_by_gpu():
    """The interval's residuals: each run of a cell gives two, its error without its family and without its GPU
    in the fit (bench/calibration/run.py -> release_holdout.py)."""
    cells = calibrated_cells()
    assert all(len(cell.heldout_errors) == 2 * cell.runs for cell in cells)
    assert all(-0.9 < error < 2.0 for cell in cells for error in cell.heldout_errors)


def test_a_mechanism_no_published_run_had_gets_the_caveat_and_the_wider_band():
    """GPT-OSS is an MoE model like DeepSeek-V3, but its sinks, 128-token windows, biased experts and clamped gate
    are kernels no calibration run ran: its estimate says so, and its 80 % band is the outside one, wider than the
    band the same family's cell gives a model without them."""
    gpu = get_gpu("b200")
    oss = coverage_for(get_model("gpt-oss-120b"), gpu, "fp8")
    assert set(oss.unchecked_mechanisms) == {"attention sinks", "biased experts", "clamped gated activation",
                                             "sliding-window attention", EXPONENTIAL_BOUND}  # head dim 64 on B200
    assert oss.needs_caveat and "attention sinks" in oss.statement()
    plain = coverage_for(get_model("deepseek-v3"), gpu, "fp8")
    assert plain.unchecked_mechanisms == () and not plain.needs_caveat
    assert "multi-latent attention" in checked_mechanisms() and "mixture of experts" in checked_mechanisms()
    wide, narrow = band_for(get_model("gpt-oss-120b"), gpu, "fp8"), band_for(get_model("deepseek-v3"), gpu, "fp8")
    assert wide.p90_error - wide.p10_error > 1.5 * (narrow.p90_error - narrow.p10_error)


def test_mechanisms_name_each_priced_code_path_and_a_plain_dense_model_has_none():
    assert mechanisms(get_model("llama3.1-70b")) == frozenset()
    assert mechanisms(get_model("llama3.1-70b"), "fp8-tensorwise") == mechanisms(get_model("llama3.1-70b"), "fp8")
    assert mechanisms(get_model("llama3.1-70b"), "fp8-blockwise") == {"blockwise-scaled FP8 GEMMs"}
    assert "Gated DeltaNet" in mechanisms(get_model("qwen3-next-80b-a3b"))
    assert "Mamba-2 mixer" in mechanisms(get_model("nemotron-h-8b"))
    assert {"mixture of experts", "multi-latent attention", "multi-token prediction"} <= mechanisms(
        get_model("deepseek-v3"))


def test_deepseek_v4s_new_mechanisms_are_named_as_checked_by_no_published_run():
    v4 = get_model("deepseek-v4-flash")
    new = {"compressed KV attention (DeepSeek-V4)", "grouped low-rank output projection", "hyper-connections",
           "hash-routed experts"}
    assert new <= mechanisms(v4) and not new & checked_mechanisms()
    gpu = get_gpu("b200")
    coverage, band = coverage_for(v4, gpu, "bf16"), band_for(v4, gpu, "bf16")
    assert new <= set(coverage.unchecked_mechanisms) and coverage.needs_caveat
    v3 = band_for(get_model("deepseek-v3"), gpu, "bf16")
    assert band.p90_error - band.p10_error > v3.p90_error - v3.p10_error


def test_a_hybrid_with_experts_borrows_the_moe_familys_errors_a_dense_hybrid_every_cells():
    """No hybrid run is calibrated: a Mamba + MoE model's interval comes from the MoE runs' held-out errors (its
    dispatch, grouped GEMMs and all-to-alls are theirs), not from the dense-heavy spread of every cell."""
    from megapilot.estimate.coverage import band_for

    moe_hybrid = get_model("nemotron3-nano")
    assert moe_hybrid.is_hybrid and moe_hybrid.moe is not None
    band = band_for(moe_hybrid, get_gpu("b200"), "fp8")
    assert band.basis.startswith("moe models: ") and "widened x2.0" in band.basis
    moe_errors = [e for c in calibrated_cells() if c.family == "moe" for e in c.heldout_errors]
    every_errors = [e for c in calibrated_cells() for e in c.heldout_errors]
    assert len(moe_errors) < len(every_errors) and str(len(moe_errors)) in band.basis
    dense_hybrid = get_model("nemotron-h-8b")
    assert dense_hybrid.is_hybrid and dense_hybrid.moe is None
    assert band_for(dense_hybrid, get_gpu("b200"), "fp8").basis.startswith("every calibrated cell: ")



def test_a_cpu_gets_no_interval_from_the_gpus_errors_and_says_what_paces_it():
    from megapilot.catalog.host import host_spec
    from megapilot.estimate.coverage import band_for, coverage_for

    cpu = host_spec({"matmul_tflops": 0.2, "matmul_tflops_one_thread": 0.1, "memory_tbps": 0.01, "ops_per_s": 2e5,
                     "elements_per_s": 1e9, "runtime_gib": 0.4})
    model = get_model("tiny")
    coverage = coverage_for(model, cpu, "bf16")
    assert coverage.host_paced and coverage.needs_caveat and band_for(model, cpu, "bf16") is None
    assert "per-op rates" in coverage.statement() and "no interval is stated" in coverage.statement()
    assert band_for(model, get_gpu("h100"), "bf16") is not None  # a GPU keeps its interval


def test_a_cpus_stated_first_prediction_error_is_the_committed_benchs():
    """The range a CPU estimate quotes for itself is bench/trainer_cpu/first_prediction.json's, not an older run's
    (it said 4-24 % after the host rates' upper median had brought the bench to 1-16 %)."""
    import json
    from pathlib import Path

    from megapilot.estimate.coverage import CPU_FIRST_PREDICTION_ERROR_PCT

    bench = Path(__file__).parents[2] / "bench" / "trainer_cpu" / "first_prediction.json"
    errors = [abs(100 * case["error_vs_median"]) for case in json.loads(bench.read_text())]
    assert (max(1, round(min(errors))), round(max(errors))) == CPU_FIRST_PREDICTION_ERROR_PCT


def test_an_uncalibrated_blackwell_case_borrows_the_nearest_generations_errors_not_the_busiest_cells():
    """Among same-family cells of other GPUs, the machine decides before the run count: a GB200 bf16 dense case is
    nearer an H100's errors (the next generation) than an A100's (two away), however many runs the A100 cell has;
    a cell of its own GPU at another precision is nearer still (the same clocks, HBM and NVLink domain)."""
    from megapilot.estimate.coverage import nearest_coverage

    a100 = CoverageCell("dense", "A100-SXM4-80GB", "bf16", 24, 0.02, 0.0)
    h100 = CoverageCell("dense", "H100-SXM5-80GB", "bf16", 9, 0.03, 0.0)
    gb200_fp8 = CoverageCell("dense", "GB200", "fp8", 12, 0.04, 0.0)
    b200_fp8 = CoverageCell("dense", "B200", "fp8", 8, 0.05, 0.0)
    for gpu in ("GB200", "B200"):
        assert nearest_coverage((a100, h100), "dense", gpu, "NVIDIA", "blackwell", "bf16").nearest == h100
    assert nearest_coverage((a100, h100, gb200_fp8), "dense", "GB200", "NVIDIA", "blackwell",
                            "bf16").nearest == gb200_fp8
    # within one architecture and precision this GPU's own cell comes before its busier sibling's
    assert nearest_coverage((gb200_fp8, b200_fp8), "dense", "B200", "NVIDIA", "blackwell",
                            "bf16").nearest == b200_fp8
    # the same machine at the case's own precision comes before it: an H200 leans on the H100's bf16 runs
    assert nearest_coverage((a100, h100, gb200_fp8), "dense", "H200-SXM-141GB", "NVIDIA", "hopper",
                            "bf16").nearest == h100
    coverage = coverage_for(get_model("llama3.1-70b"), get_gpu("gb200"), "bf16")
    assert coverage.nearest is not None and coverage.nearest.gpu != "A100-SXM4-80GB"
    assert "nearest: dense on GB200 fp8" in coverage.statement()


def test_a_gemm_format_no_published_run_used_widens_the_band_as_a_models_mechanism_does():
    """Block-scaled GEMMs are priced apart from per-tensor FP8 (their rate, their casts): an estimate in a format no
    calibration run used is checked by nothing, whatever its cell. Were MXFP8 never published, a Llama 3 70B on
    B200 in MXFP8 would get the outside band, twice the cell's; the committed runs include MXFP8 and NVFP4 is not."""
    llama, gpu = get_model("llama3.1-70b"), get_gpu("b200")
    cells = calibrated_cells()
    placed = nearest_coverage(cells, "dense", gpu.name, gpu.vendor, gpu.architecture, "fp8")
    unseen = error_band(cells, with_mechanisms(placed, llama, gpu, "mxfp8", ("MXFP8 GEMMs",)))
    seen = error_band(cells, with_mechanisms(placed, llama, gpu, "mxfp8", ()))
    assert unseen.p90_error - unseen.p10_error > 1.8 * (seen.p90_error - seen.p10_error)
    assert "MXFP8 GEMMs" in checked_mechanisms() and "NVFP4 GEMMs" not in checked_mechanisms()
    assert band_for(llama, gpu, "fp8-tensorwise") == band_for(llama, gpu, "mxfp8")


def test_the_committed_interval_coverage_is_what_coverage_only_recomputes():
    """`bench/calibration/run.py --coverage-only` judges every held-out row, a parenthesized run at its twin's
    layout too, as the full run does; only the interval's residuals leave such repeats out. (It had judged 86 of
    each split's 96 rows: family out 77 % where the full run said 75 %.)"""
    import copy
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).parents[2] / "bench" / "calibration" / "run.py"
    spec = importlib.util.spec_from_file_location("calibration_run", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    committed = json.loads((path.parent / "results.json").read_text())
    recomputed = copy.deepcopy(committed)
    bench.coverage_only(recomputed, bench.load_rows()[0], bench.load_release_rows()[0])
    held_out = ("release hold-out", "leave-one-source-out", "leave-one-family-out", "leave-one-GPU-out")
    for split in held_out:
        for key in ("interval_coverage", "interval_median_width"):
            assert recomputed["splits"][split][key] == pytest.approx(committed["splits"][split][key]), (split, key)
    assert len(committed["heldout_errors"]) == committed["splits"]["leave-one-family-out"]["model"]["rows"]
    assert len(committed["heldout_residuals"]) < len(committed["heldout_errors"])
