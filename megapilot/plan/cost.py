"""The planner's view of the cost model: memoised calls into `megapilot.estimate`.

The planner owns no formula. Every number it ranks or explains comes from the estimator; this
wrapper only binds the fixed inputs (model, cluster, training), caches results per layout (the
search and the reasons ask for the same layout more than once), and splits a call in two stages:
memory first (cheap: most layouts die here), the full estimate (step time) only for layouts that fit.
It counts both kinds of call for the latency benchmark.

The search's own rules already guarantee a legal layout, so it uses the estimator's unvalidated fast
path (`estimate_fast`); `validated()` runs the public `estimate()` (validation and its warnings) for
the layouts that are finally shown.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from megapilot.estimate import EstimateOptions, estimate, estimate_fast, memory_per_gpu, to_result
from megapilot.estimate.step_time import stage_time_weights
from megapilot.spec import ClusterSpec, EstimateResult, ModelSpec, ParallelConfig, TrainingSpec
from megapilot.spec.pipeline import StageWeights

if TYPE_CHECKING:
    from megapilot.estimate import EstimateOptions, MemoryBreakdown

LayoutEstimator = Callable[[ParallelConfig], EstimateResult]

# Memory the planner leaves free on every GPU beyond the estimate's own overhead allowance (CUDA context,
# NCCL buffers, 10 % of activations for fragmentation), as a share of HBM. Default none: the allowance is
# the model's stated margin; a user who wants room for allocator spikes or checkpoint staging asks for it
# (an estimate already warns below 5 % left).
DEFAULT_HEADROOM_FRACTION = 0.0


@dataclass(frozen=True)
class MemoryCheck:
    """The memory stage's verdict for one layout, GiB of the most-loaded GPU."""

    total_gib: float
    capacity_gib: float
    activations_gib: float
    static_gib: float  # weights + gradients + optimizer states: what no MBS or recompute choice changes

    @property
    def fits(self) -> bool:
        return self.total_gib <= self.capacity_gib


class CostModel:
    """Estimates for one (model, cluster, training) triple, memoised by layout.

    `estimator` replaces the whole estimator (tests, what-if studies); memory is then read from its
    results. Without it the memory stage calls `megapilot.estimate.memory_per_gpu` the way
    `estimate_fast` does, and the full stage `estimate_fast` itself.
    """

    def __init__(
        self,
        model: ModelSpec,
        cluster: ClusterSpec,
        training: TrainingSpec,
        estimator: LayoutEstimator | None = None,
        options: EstimateOptions | None = None,
        headroom_fraction: float = DEFAULT_HEADROOM_FRACTION,
    ):
        self.model = model
        self.cluster = cluster
        self.training = training
        self.options = options  # run features the layout does not say (None: the estimator's defaults)
        self.headroom_fraction = headroom_fraction  # share of HBM a planned layout must leave free
        self._injected = estimator
        self._breakdowns: dict[ParallelConfig, MemoryBreakdown] = {}  # the memory stage's, for the estimate
        self._estimator = estimator or self._default_estimator()
        self._memory_fn = None if estimator else self._default_memory()
        self._estimates: dict[ParallelConfig, EstimateResult] = {}
        self._memory: dict[ParallelConfig, MemoryCheck] = {}
        self._weights: dict[tuple[object, ...], StageWeights] = {}
        self.calls = 0
        self.memory_calls = 0

    def _default_estimator(self) -> LayoutEstimator:
        model, cluster, training = self.model, self.cluster, self.training
        options = self.options or EstimateOptions()
        # the memory stage's breakdown of the layout, when it ran: the estimate would compute the same again
        return lambda parallel: to_result(model, estimate_fast(model, cluster, training, parallel, options,
                                                               memory=self._breakdowns.get(parallel)))

    def _default_memory(self) -> Callable[[ParallelConfig], MemoryCheck]:
        model, training, capacity = self.model, self.training, self.cluster.gpu.hbm_gib
        architecture, runtime_gib = self.cluster.gpu.architecture, self.cluster.gpu.host_runtime_gib
        # The same arguments `estimate_fast` passes (tests/plan/test_cost.py checks that both stages
        # agree on every verdict).
        def memory(parallel: ParallelConfig) -> MemoryCheck:
            m = self._breakdowns[parallel] = memory_per_gpu(model, training, parallel, capacity,
                                                            architecture=architecture, host_runtime_gib=runtime_gib)
            return MemoryCheck(m.total_gib, self._usable(m.capacity_gib), m.activations_gib,
                               m.weights_gib + m.gradients_gib + m.optimizer_gib)

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
                cached = MemoryCheck(m.total, self._usable(m.capacity), m.activations,
                                     m.weights + m.gradients + m.optimizer)
            else:
                self.memory_calls += 1
                cached = self._memory_fn(parallel)
            self._memory[parallel] = cached
        return cached

    def stage_weights(self, parallel: ParallelConfig) -> StageWeights | None:
        """Each pipeline-layout item's time on this layout, to balance a layout string by (None with an injected
        estimator, which prices no items: the string is then cut by FLOPs). Items cost what the layout's TP, CP,
        EP, expert TP and MBS make them, whatever its PP."""
        if self._injected is not None:
            return None
        p = parallel
        key = (p.tp, p.cp, p.cp_comm_type, p.ep, p.expert_tp, p.mbs, p.sequence_parallel, p.pp == 1 or p.vpp > 1)
        cached = self._weights.get(key)
        if cached is None:
            cached = self._weights[key] = stage_time_weights(self.model, self.cluster, self.training, parallel,
                                                             self.options or EstimateOptions())
        return cached

    def fits(self, est: EstimateResult) -> bool:
        """Whether a full estimate leaves the headroom free (the memory stage's verdict, from the estimate)."""
        return est.fits and est.memory_gib.total <= self._usable(est.memory_gib.capacity)

    def _usable(self, capacity_gib: float) -> float:
        """What a planned layout may fill: the HBM less the headroom."""
        return capacity_gib * (1 - self.headroom_fraction)

    def validated(self, parallel: ParallelConfig) -> EstimateResult:
        """The public estimate of a layout that will be shown: validated, with its warnings."""
        if self._injected is not None:
            return self(parallel)
        # a TP group across the trays of one NVLink domain (the search walks it there: `space.tp_limit`)
        across_trays = parallel.tp > self.cluster.gpus_per_node
        return estimate(self.model, self.cluster, self.training, parallel, self.options or EstimateOptions(),
                        allow_tp_across_nodes=across_trays)

    def with_inputs(self, *, cluster: ClusterSpec | None = None, training: TrainingSpec | None = None,
                    headroom_fraction: float | None = None) -> CostModel:
        """A fresh cost model for changed inputs (the what-if searches of the nothing-fits advice)."""
        headroom = self.headroom_fraction if headroom_fraction is None else headroom_fraction
        return CostModel(self.model, cluster or self.cluster, training or self.training, self._injected,
                         self.options, headroom)
