"""The planner's view of the cost model: memoised calls into `megapilot.estimate`.

The planner owns no formula. Every number it ranks or explains comes from the estimator; this
wrapper only binds the fixed inputs (model, cluster, training), caches results per layout (the
search and the reasons ask for the same layout more than once), and splits a call in two stages:
memory first (cheap: most layouts die here), the full estimate (step time) only for layouts that fit.
It counts both kinds of call for the latency benchmark.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from megapilot.spec import ClusterSpec, EstimateResult, ModelSpec, ParallelConfig, TrainingSpec

LayoutEstimator = Callable[[ParallelConfig], EstimateResult]


@dataclass(frozen=True)
class MemoryCheck:
    """The memory stage's verdict for one layout, GiB of the most-loaded GPU."""

    total_gib: float
    capacity_gib: float
    activations_gib: float

    @property
    def fits(self) -> bool:
        return self.total_gib <= self.capacity_gib


class CostModel:
    """Estimates for one (model, cluster, training) triple, memoised by layout.

    `estimator` replaces the whole estimator (tests, what-if studies); memory is then read from its
    results. Without it, the memory stage calls `megapilot.estimate.memory.memory_per_gpu` and the
    full stage `megapilot.estimate.estimate`.
    """

    def __init__(
        self,
        model: ModelSpec,
        cluster: ClusterSpec,
        training: TrainingSpec,
        estimator: LayoutEstimator | None = None,
    ):
        self.model = model
        self.cluster = cluster
        self.training = training
        self._injected = estimator
        self._estimator = estimator or self._default_estimator()
        self._memory_fn = None if estimator else self._default_memory()
        self._estimates: dict[ParallelConfig, EstimateResult] = {}
        self._memory: dict[ParallelConfig, MemoryCheck] = {}
        self.calls = 0
        self.memory_calls = 0

    def _default_estimator(self) -> LayoutEstimator:
        from megapilot.estimate import estimate  # imported late: keeps `megapilot --help` fast

        model, cluster, training = self.model, self.cluster, self.training
        return lambda parallel: estimate(model, cluster, training, parallel)

    def _default_memory(self) -> Callable[[ParallelConfig], MemoryCheck] | None:
        try:
            from megapilot.estimate.memory import memory_per_gpu
        except ImportError:  # an estimator without a separate memory stage: use the full estimate
            return None
        model, training, capacity = self.model, self.training, self.cluster.gpu.hbm_gib

        def memory(parallel: ParallelConfig) -> MemoryCheck:
            m = memory_per_gpu(model, training, parallel, capacity)
            return MemoryCheck(m.total_gib, m.capacity_gib, m.activations_gib)

        return memory

    def __call__(self, parallel: ParallelConfig) -> EstimateResult:
        cached = self._estimates.get(parallel)
        if cached is None:
            self.calls += 1
            cached = self._estimates[parallel] = self._estimator(parallel)
        return cached

    def memory(self, parallel: ParallelConfig) -> MemoryCheck:
        """The memory stage: cheap, and enough to drop a layout that does not fit."""
        cached = self._memory.get(parallel)
        if cached is None:
            if self._memory_fn is None:
                m = self(parallel).memory_gib
                cached = MemoryCheck(m.total, m.capacity, m.activations)
            else:
                self.memory_calls += 1
                cached = self._memory_fn(parallel)
            self._memory[parallel] = cached
        return cached

    def fits(self, parallel: ParallelConfig) -> bool:
        """Memory stage first; the full estimate has the last word for a layout that passes it."""
        return self.memory(parallel).fits and self(parallel).fits

    def with_inputs(self, *, cluster: ClusterSpec | None = None, training: TrainingSpec | None = None) -> "CostModel":
        """A fresh cost model for changed inputs (the what-if searches of the nothing-fits advice)."""
        return CostModel(self.model, cluster or self.cluster, training or self.training, self._injected)
