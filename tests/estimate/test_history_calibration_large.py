"""`history calibration` on a large history: each held-out run is predicted from its `MAX_RUNS` nearest others (as
`calibrate` predicts a case), up to `MAX_RUNS` + 1 runs from all the others as before, and the check grows with the
runs, not with their square."""

from __future__ import annotations

import random
import time

from megapilot.estimate.history_calibration import (
    CORRECTIONS,
    MAX_RUNS,
    MeasuredRun,
    RunKey,
    StepComponents,
    cluster_fits,
    fit,
    miss,
    nearness,
)


def _history(count: int, seed: int = 3) -> list[MeasuredRun]:
    """One group's runs (H100, bf16, dense) of several layouts: a cluster 15 % slower in compute, 1.6x in
    collectives, with 5 % noise and an overhead per micro-batch."""
    rng = random.Random(seed)
    runs = []
    for index in range(count):
        tp, pp, mbs = rng.choice([1, 2, 4, 8]), rng.choice([1, 2, 4]), rng.choice([1, 2, 4])
        gpus = rng.choice([8, 16, 32, 64])
        key = RunKey(model=rng.choice(["llama3.1-8b", "llama3.1-70b"]), family="dense", precision="bf16", gpu="H100",
                     gpus=gpus, tp=tp, pp=pp, mbs=mbs, gbs=rng.choice([128, 256, 512]), seq_len=8192)
        compute = 8.0 / (tp * pp) * rng.uniform(0.8, 1.2)
        predicted = StepComponents(compute, 0.1 * compute * (pp - 1), 0.05 * tp, 0.02 * gpus / 8, 0.05)
        measured = (1.15 * (predicted.compute_s + predicted.bubble_s) + 1.6 * predicted.scaleup_comm_s
                    + predicted.scaleout_comm_s + predicted.fixed_s + 0.002 * key.microbatches)
        runs.append(MeasuredRun(f"run-{index:03d}", key, predicted, measured * rng.lognormvariate(0.0, 0.05)))
    return runs


def _held_out_medians(runs: list[MeasuredRun], nearest: int | None) -> dict[str, list[float]]:
    """Each run predicted by a fit on its `nearest` nearest others (None: all of them), every correction and each
    alone: the held-out errors written out from `fit`, run by run."""
    errors: dict[str, list[float]] = {"all": [], **{name: [] for name in CORRECTIONS}}
    for index, run in enumerate(runs):
        others = [(i, other) for i, other in enumerate(runs) if i != index]
        if nearest is not None:
            ranked = sorted(others, key=lambda pair: -nearness(run.key, pair[1].key))[:nearest]
            others = sorted(ranked, key=lambda pair: pair[0])
        kept = [other for _, other in others]
        weights = [nearness(run.key, other.key) for other in kept]
        for name, free in [("all", CORRECTIONS), *((name, (name,)) for name in CORRECTIONS)]:
            corrections = fit(kept, weights, free)
            errors[name].append(miss(corrections.apply(run.predicted, run.key.microbatches),
                                     run.measured_step_time_s))
    return errors


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def test_a_group_of_more_than_max_runs_holds_each_run_out_against_its_nearest_runs() -> None:
    runs = _history(MAX_RUNS + 20)
    [group] = cluster_fits(runs)
    expected = _held_out_medians(runs, MAX_RUNS)
    assert group.runs == len(runs)
    assert abs(group.held_out.median - _median(expected["all"])) < 1e-9
    for name in CORRECTIONS:
        assert abs(group.median_by_correction[name] - _median(expected[name])) < 1e-9, name


def test_a_group_of_up_to_max_runs_plus_one_holds_each_run_out_against_all_the_others() -> None:
    runs = _history(MAX_RUNS + 1, seed=5)
    [group] = cluster_fits(runs)
    expected = _held_out_medians(runs, None)
    assert group.held_out.median == _median(expected["all"])
    assert group.median_by_correction == {name: _median(expected[name]) for name in CORRECTIONS}


def test_four_hundred_runs_of_one_group_fit_in_well_under_a_few_seconds() -> None:
    # every run refitted on every other, six times over, took 14 s of CPU for 400 runs (quadratic in the runs)
    runs = _history(400, seed=11)
    started = time.process_time()
    [group] = cluster_fits(runs)
    spent = time.process_time() - started
    assert group.runs == 400
    assert spent < 4.0, f"{spent:.1f} s of CPU for 400 runs"
