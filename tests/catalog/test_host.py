"""This machine's CPU as a device: measured by real probes, cached per machine, measured again on demand."""

from __future__ import annotations

import json

import pytest

from megapilot.catalog import host


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(host.CACHE_ENV, str(tmp_path))
    host._host_rates.cache_clear()
    yield tmp_path
    host._host_rates.cache_clear()


def test_the_cpu_is_measured_once_and_read_from_the_cache_after(cache):
    spec = host.host_cpu()
    assert spec.architecture == "cpu" and spec.alias == "cpu"
    assert spec.bf16_dense_tflops > 0 and spec.hbm_bw_tbps > 0
    assert spec.scaleup_bw_gbps == pytest.approx(spec.hbm_bw_tbps * 1000 / host.GLOO_MEMORY_PASSES)
    path = host.cache_path()
    assert path.parent == cache and path.is_file()
    # the cache is what a later call reads (written here with rates no probe would give)
    path.write_text(json.dumps({"matmul_tflops_one_thread": 61.0, "memory_tbps": 4.5, "ops_per_s": 2e5,
                                "elements_per_s": 1e9, "runtime_gib": 0.4}))
    assert host.host_cpu().bf16_dense_tflops == 61.0
    # measuring again replaces it
    assert host.host_cpu(remeasure=True).bf16_dense_tflops < 50
    assert json.loads(path.read_text())["matmul_tflops_one_thread"] < 50


def test_the_estimator_predicts_a_run_on_the_cpu(cache):
    from megapilot.catalog.gpus import get_gpu
    from megapilot.estimate import build_case, estimate

    assert get_gpu("CPU").architecture == "cpu"
    case = build_case(model="tiny", gpu="cpu", gpus=2, seq_len=128, gbs=8, mbs=1)
    result = estimate(case.model, case.cluster, case.training, case.parallel)
    assert result.step_time_s > 0 and result.tokens_per_s_per_gpu > 0


def test_gpus_lists_the_cpu_and_measures_it_again_on_demand(cli, cache):
    rows = cli("gpus", "--json", "--measure-host").json()
    cpu = [row for row in rows if row["alias"] == "cpu"]
    assert len(cpu) == 1 and "measured on this machine" in cpu[0]["source"]


def test_a_figure_measured_on_a_busy_machine_heals_when_it_is_measured_again(cache):
    import time

    path = host.cache_path()
    fresh = host.host_cpu(remeasure=True).bf16_dense_tflops
    low = {"matmul_tflops_one_thread": fresh / 1000, "memory_tbps": 1e-6, "ops_per_s": 1.0, "elements_per_s": 1.0,
           "runtime_gib": 0.4}
    path.write_text(json.dumps(low | {"measured_at": time.time()}))  # recent: used as it is
    assert host.host_cpu().bf16_dense_tflops == pytest.approx(fresh / 1000)
    path.write_text(json.dumps(low | {"measured_at": time.time() - host.REFRESH_S - 1}))  # stale: taken again
    healed = host.host_cpu()
    assert healed.bf16_dense_tflops == pytest.approx(fresh) and healed.hbm_bw_tbps > 1e-6
    assert healed.host_op_s < 1.0  # an op's cost heals too: of two measurements the better is kept
    assert healed.host_element_s < 1e-6  # and an element's
    assert json.loads(path.read_text())["matmul_tflops_one_thread"] == pytest.approx(fresh)  # and cached


def test_each_rate_is_the_upper_median_of_the_last_measurements_not_the_best_ever(cache, monkeypatch):
    """Keeping the best figure ever measured ratcheted an op's cost down to what no run sees (10.3 us against
    12-14 typical here) and every first CPU prediction fast; a lucky quiet second is outvoted like a busy one."""
    import time

    ops = iter([70_000.0, 75_000.0, 140_000.0, 80_000.0, 72_000.0, 78_000.0])  # one lucky, then typical
    monkeypatch.setattr(host, "probe", lambda: {"matmul_tflops_one_thread": 0.1, "memory_tbps": 0.02,
                                                "ops_per_s": next(ops), "elements_per_s": 1e9,
                                                "runtime_gib": 0.5})
    path = host.cache_path()
    seen = []
    for _ in range(6):
        host._host_rates.cache_clear()
        raw = json.loads(path.read_text()) if path.exists() else None
        if raw is not None:  # an hour later
            path.write_text(json.dumps(raw | {"measured_at": time.time() - host.REFRESH_S - 1}))
        seen.append(1 / host.host_cpu().host_op_s)
    assert seen[:2] == pytest.approx([70_000, 75_000])  # of two, the better
    assert seen[2] == pytest.approx(75_000)  # the lucky 140,000 outvoted
    assert seen[-1] == pytest.approx(78_000)  # the last five: 75, 140, 80, 72, 78 thousand
    assert len(json.loads(path.read_text())["measurements"]) == host.KEPT_MEASUREMENTS


def test_a_rank_computes_with_the_threads_the_ranks_beside_it_leave():
    """megapilot's launch gives every rank one OpenMP thread, a lone one's too; more ranks than cores share them.
    Priced at the every-core rate, the demo's two ranks on two cores ran twice as slowly, and so did a lone rank."""
    rates = {"matmul_tflops_one_thread": 0.11, "memory_tbps": 0.03, "ops_per_s": 2e5}
    assert host.rank_matmul_tflops(rates, 2, 1) == 0.11
    assert host.rank_matmul_tflops(rates, 2, 2) == 0.11
    assert host.rank_matmul_tflops(rates, 2, None) == 0.11
    assert host.rank_matmul_tflops(rates, 2, 8) == pytest.approx(0.11 / 4)


def test_each_rank_pays_one_ops_cost_and_more_where_ranks_outnumber_cores():
    """An op runs on its rank's one thread: two ranks on two cores each pay the one-thread cost; eight share them.
    An element of element-wise work likewise."""
    rates = {"ops_per_s": 2e5, "elements_per_s": 1e9, "runtime_gib": 0.4}
    assert host.rank_op_s(rates, 2, 1) == host.rank_op_s(rates, 2, 2) == pytest.approx(5e-6)
    assert host.rank_op_s(rates, 2, 8) == pytest.approx(2e-5)
    assert host.rank_op_s(rates, 2, 8, "elements_per_s") == pytest.approx(4e-9)


def test_the_probe_times_real_ops_of_the_trainers_model(cache):
    """The op cost comes from ops the probe really ran and counted: the trainer's model on tiny tensors runs over
    ten thousand ops a second on any CPU that trains at all (60,000-100,000 on a 2-core EPYC), and under a hundred
    million (a count of 0 or a pass that did no work would give one of the two). Its element-wise ops write tens
    of millions to tens of billions of elements a second (1.3-1.8 billion here; the probe's cap is 1e11)."""
    rates = host._op_rates()
    assert 1e4 < rates["ops_per_s"] < 1e8
    assert 1e7 < rates["elements_per_s"] < 5e10


def test_a_cache_written_before_the_one_thread_rate_was_measured_is_measured_again(cache):
    path = host.cache_path()
    path.write_text(json.dumps({"matmul_tflops_one_thread": 123.0, "memory_tbps": 4.5, "measured_at": 4e9}))
    assert host.host_cpu().bf16_dense_tflops < 50  # measured (no op rate cached), not read
    assert set(host.RATE_KEYS) <= set(json.loads(path.read_text()))


def test_an_estimate_on_the_cpu_prices_each_rank_at_its_share_of_the_machine(cache):
    from megapilot.estimate import build_case

    host.cache_path().write_text(json.dumps({"matmul_tflops_one_thread": 0.11, "memory_tbps": 0.03,
                                             "ops_per_s": 2e5, "elements_per_s": 1e9, "runtime_gib": 0.4,
                                             "measured_at": 4e9}))
    lone = build_case(model="tiny", gpu="cpu", gpus=1, seq_len=128, gbs=8, mbs=1)
    pair = build_case(model="tiny", gpu="cpu", gpus=2, seq_len=128, gbs=8, mbs=1)
    assert lone.cluster.gpu.bf16_dense_tflops == pair.cluster.gpu.bf16_dense_tflops == 0.11


def test_an_op_probe_that_cannot_run_is_a_clear_error_naming_how_to_see_why(monkeypatch):
    """No megatron-core (or a broken one) in the interpreter: the probe says so, with the command that shows the
    error, not a traceback of a JSON decode."""
    from megapilot.errors import MegapilotError

    monkeypatch.setattr(host.sys, "executable", "/bin/false")
    with pytest.raises(MegapilotError) as caught:
        host._op_rates()
    assert "one op's cost" in str(caught.value) and "megapilot.trainer.op_probe" in caught.value.fix
