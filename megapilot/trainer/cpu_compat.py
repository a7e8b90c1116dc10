"""Everything the trainer changes so that Megatron-Core 0.16.1 trains on a machine without a GPU.

Megatron-Core assumes CUDA in many places (device arguments, `.cuda()`, the RNG tracker, tensor
type-string assertions). Rather than editing Megatron's files, `enable_cpu_mode()` installs, for
this process only:

1. `CudaToCpuMode`, a `TorchFunctionMode` that rewrites CUDA device arguments (`device="cuda"`,
   `device=0`, `.cuda()`, `.to("cuda")`) to the CPU, and answers the query form of
   `Tensor.type()` with the `torch.cuda.*` name that Megatron's assertions expect;
2. `torch.cuda.current_device() → 0` and `torch.cuda.synchronize() → no-op`;
3. `CpuRngStatesTracker` in place of Megatron's CUDA RNG tracker (same interface, CPU generator
   states), and the CPU generator's state where activation recomputation saves "the CUDA RNG state";
4. the same mode inside custom autograd backwards (modes are not active there by default);
5. TransformerConfig overrides (`CPU_TRANSFORMER_OVERRIDES`), each with its reason.

`install_distributed_optimizer_fixes()` patches three Megatron bugs in loading a distributed-
optimizer checkpoint that appear whenever neither Apex nor Transformer Engine is installed (so
torch's Adam is used) — on CPU, always; on a GPU, only without Apex/TE. The sharding-type choice
that avoids the fourth bug is `DISTRIBUTED_OPTIMIZER_SHARDING_TYPE`, used by the checkpoint code.

Each rewrite is recorded in `REWRITES` (what, and how many times) so the trainer can print a one-line
summary at start and a test can see that the rewrites really happen. Nothing here runs when
`torch.cuda.is_available()` is true, except the optimizer fixes under the condition above.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch.overrides import TorchFunctionMode

if TYPE_CHECKING:
    from megatron.core.optimizer import MegatronOptimizer

#: Sharding type for distributed-optimizer checkpoints. Megatron's default
#: (`fully_sharded_model_space`) fails to save with torch's Adam ("ShardedTensor.flattened_range is
#: not supported"); `fully_reshardable` saves and reloads under another TP/PP/DP layout.
DISTRIBUTED_OPTIMIZER_SHARDING_TYPE = "fully_reshardable"


@dataclass
class RewriteLog:
    """Counts of every rewrite performed, by kind (e.g. "device cuda→cpu in torch.empty")."""

    counts: collections.Counter[str] = field(default_factory=collections.Counter)
    installed: list[str] = field(default_factory=list)

    def record(self, kind: str) -> None:
        self.counts[kind] += 1

    def summary(self) -> str:
        """One line: what was installed, and the rewrites seen so far."""
        installed = "; ".join(self.installed) or "nothing"
        return f"cpu-compat: installed {installed}"

    def rewrite_summary(self) -> str:
        total = sum(self.counts.values())
        top = ", ".join(f"{kind} ×{n}" for kind, n in self.counts.most_common(6))
        return f"cpu-compat: {total} rewrites ({top})" if total else "cpu-compat: no rewrites"


REWRITES = RewriteLog()


def _is_cuda_device(device: object) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.startswith("cuda")
    # A bare integer device is a CUDA ordinal in torch's API.
    return isinstance(device, int) and not isinstance(device, bool)


def _func_name(func: object) -> str:
    return str(getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func)))


class CudaToCpuMode(TorchFunctionMode):
    """Rewrites CUDA device requests to the CPU and answers CUDA type-string queries."""

    def __torch_function__(
        self, func: Callable[..., Any], types: object, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = dict(kwargs or {})
        name = _func_name(func)
        if func is torch.Tensor.cuda:
            REWRITES.record("Tensor.cuda() → no-op")
            return args[0]
        if func is torch.device and args and _is_cuda_device(args[0]):
            # `with torch.device(torch.cuda.current_device())` (YaRN's rotary embedding under MLA).
            REWRITES.record("torch.device(cuda) → cpu")
            return torch.device("cpu")
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            return self._cuda_type_name(func(*args))
        if "device" in kwargs and _is_cuda_device(kwargs["device"]):
            kwargs["device"] = "cpu"
            REWRITES.record(f"device cuda→cpu in {name}")
        if func in (torch.Tensor.to,) and len(args) > 1 and _is_cuda_device(args[1]):
            args = (args[0], "cpu", *args[2:])
            REWRITES.record("Tensor.to(cuda) → cpu")
        return func(*args, **kwargs)

    @staticmethod
    def _cuda_type_name(type_name: str) -> str:
        # Megatron asserts e.g. `param.grad.type() == 'torch.cuda.FloatTensor'`.
        if type_name.startswith("torch.") and not type_name.startswith("torch.cuda."):
            REWRITES.record("Tensor.type() answered as torch.cuda.*")
            return "torch.cuda." + type_name.removeprefix("torch.")
        return type_name


class CpuRngStatesTracker:
    """Megatron's `CudaRNGStatesTracker` interface over CPU generator states.

    Megatron forks named RNG streams (data-parallel, model-parallel, expert-parallel) around
    dropout and weight init; on CPU they all fork the CPU generator.
    """

    def __init__(self, *args: object, **kwargs: object) -> None:  # Megatron's tracker takes arguments we ignore
        self.reset()

    def is_initialized(self) -> bool:
        return self._is_initialized

    def reset(self) -> None:
        self._is_initialized = False
        self.states_: dict[str, torch.Tensor] = {}
        self.seeds_: set[int] = set()

    def get_states(self) -> dict[str, torch.Tensor]:
        return dict(self.states_)

    def set_states(self, states: dict[str, torch.Tensor]) -> None:
        self._is_initialized = True
        self.states_ = states

    def add(self, name: str, seed: int) -> None:
        self._is_initialized = True
        if seed in self.seeds_:
            raise Exception(f"seed {seed} already exists")
        if name in self.states_:
            raise Exception(f"rng state {name} already exists")
        self.seeds_.add(seed)
        saved = torch.get_rng_state()
        torch.manual_seed(seed)
        self.states_[name] = torch.get_rng_state()
        torch.set_rng_state(saved)

    @contextlib.contextmanager
    def fork(self, name: str = "model-parallel-rng") -> Iterator[None]:
        if name not in self.states_:
            raise Exception(f"rng state {name} is not added")
        saved = torch.get_rng_state()
        torch.set_rng_state(self.states_[name])
        REWRITES.record("RNG fork on CPU generator")
        try:
            yield
        finally:
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(saved)


#: TransformerConfig settings the trainer changes on CPU, with the reason for each.
CPU_TRANSFORMER_OVERRIDES: dict[str, tuple[object, str]] = {
    "use_cpu_initialization": (True, "weights are initialized on the CPU"),
    # Megatron frees a stage's output right after handing it to the (asynchronous) send; gloo's
    # isend may read it later, so the next stage would receive freed memory (NaN losses with VPP).
    "deallocate_pipeline_outputs": (False, "keep pipeline outputs alive until gloo has sent them"),
}


def transformer_overrides() -> dict[str, object]:
    """The CPU TransformerConfig overrides (recorded once as installed)."""
    note = "TransformerConfig " + ", ".join(f"{k}={v}" for k, (v, _) in CPU_TRANSFORMER_OVERRIDES.items())
    if note not in REWRITES.installed:
        REWRITES.installed.append(note)
    return {key: value for key, (value, _) in CPU_TRANSFORMER_OVERRIDES.items()}


_MODE: CudaToCpuMode | None = None


def _install_rng_tracker() -> None:
    # heavy: megatron-core; this module loads with torch alone and each patch imports what it patches
    from megatron.core.tensor_parallel import random as megatron_random

    megatron_random._CUDA_RNG_STATE_TRACKER = CpuRngStatesTracker()
    megatron_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True

    # Activation recomputation saves and restores "the CUDA RNG state" around each checkpointed
    # region; on CPU that is the CPU generator's state.
    def get_cpu_rng_state(device: object = None, clone: bool = False, graph_safe: bool = False) -> torch.Tensor:
        REWRITES.record("CUDA RNG state → CPU generator state")
        return torch.get_rng_state()

    def set_cpu_rng_state(new_state: torch.Tensor, device: object = -1, graph_safe: bool = False) -> None:
        torch.set_rng_state(new_state)

    megatron_random._get_cuda_rng_state = get_cpu_rng_state
    megatron_random._set_cuda_rng_state = set_cpu_rng_state
    REWRITES.installed.append("CPU RNG tracker and RNG-state save/restore")


def _install_cuda_query_stubs() -> None:
    torch.cuda.current_device = lambda: 0
    torch.cuda.synchronize = lambda *args, **kwargs: None
    REWRITES.installed.append("cuda.current_device→0, cuda.synchronize→no-op")


def _install_mode_in_backward() -> None:
    """Run custom autograd backwards under the mode too.

    Torch-function modes are not active while autograd runs a `torch.autograd.Function.backward`,
    and Megatron allocates with CUDA devices there (e.g. the all-gather in the MoE and
    sequence-parallel backward).
    """
    # heavy: torch.autograd internals, needed only by this patch
    from torch.autograd.function import BackwardCFunction

    original_apply = BackwardCFunction.apply

    def apply_under_cpu_mode(self: Any, *args: Any) -> Any:
        with CudaToCpuMode():
            return original_apply(self, *args)

    BackwardCFunction.apply = apply_under_cpu_mode  # type: ignore[method-assign]  # the patch is the point
    REWRITES.installed.append("the same mode inside autograd.Function backwards")


def enable_cpu_mode() -> RewriteLog:
    """Install the CPU rewrites for this process (idempotent). Refuses to run when CUDA is present."""
    global _MODE
    if torch.cuda.is_available():
        raise RuntimeError("enable_cpu_mode() is only for machines without CUDA")
    if _MODE is not None:
        return REWRITES
    _install_cuda_query_stubs()
    _install_rng_tracker()
    _MODE = CudaToCpuMode()
    _MODE.__enter__()
    REWRITES.installed.append("device/type-string rewriting mode")
    _install_mode_in_backward()
    transformer_overrides()
    return REWRITES


def disable_cpu_mode() -> None:
    """Leave the device-rewriting mode (for tests); the RNG tracker and stubs stay."""
    global _MODE
    if _MODE is not None:
        _MODE.__exit__(None, None, None)
        _MODE = None


def torch_adam_fallback_in_use() -> bool:
    """True when Megatron's distributed optimizer wraps torch's Adam (neither Apex nor TE present)."""
    # heavy: megatron-core; this module loads with torch alone and each patch imports what it patches
    from megatron.core.optimizer import distrib_optimizer

    return not distrib_optimizer.HAVE_APEX_OR_TE


def _set_main_param_and_optimizer_states_fixed(
    self: Any, model_param: torch.nn.Parameter, tensors: dict[str, torch.Tensor]
) -> None:
    """Megatron's method, copied under `no_grad`, leaving `step` alone and un-shared.

    The original copies into a leaf that requires grad outside `no_grad` (autograd error), copies
    `step` from the checkpoint (missing or reset to 0), and leaves one `step` tensor shared by
    every parameter so torch's Adam then advances it once per parameter per iteration.
    """
    if self.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8:
        assert _ORIGINAL_SET_STATES is not None  # installed before this replacement is
        return _ORIGINAL_SET_STATES(self, model_param, tensors)
    group_index, group_order = self.model_param_group_index_map[model_param]
    main_param = self.optimizer.param_groups[group_index]["params"][group_order]
    optim_state = self.optimizer.state[main_param]
    with torch.no_grad():
        main_param.copy_(tensors["param"])
        for key, value in optim_state.items():
            if key != "step" and key in tensors:
                value.copy_(tensors[key])
    if "step" in optim_state:
        optim_state["step"] = optim_state["step"].clone()
    REWRITES.record("distributed-optimizer state load (fixed method)")


_ORIGINAL_SET_STATES: Callable[..., None] | None = None


def install_distributed_optimizer_fixes() -> bool:
    """Patch the distributed optimizer's state loading when torch's Adam is in use; True if patched."""
    global _ORIGINAL_SET_STATES
    if not torch_adam_fallback_in_use():
        return False
    # heavy: megatron-core; this module loads with torch alone and each patch imports what it patches
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    if _ORIGINAL_SET_STATES is None:
        _ORIGINAL_SET_STATES = DistributedOptimizer._set_main_param_and_optimizer_states
        DistributedOptimizer._set_main_param_and_optimizer_states = _set_main_param_and_optimizer_states_fixed
        REWRITES.installed.append("distributed-optimizer load fix (torch Adam)")
    return True


def install_missing_te_fixes() -> bool:
    """Without Transformer Engine, Megatron's MoE router reads an undefined `te_general_gemm`.

    megatron-core 0.16.1 imports `te_general_gemm` only when TE is present but tests it for None
    unconditionally (NameError in every MoE forward); defining it as None selects the torch path.
    """
    # heavy: megatron-core; this module loads with torch alone and each patch imports what it patches
    from megatron.core.transformer.moe import moe_utils

    if moe_utils.HAVE_TE or hasattr(moe_utils, "te_general_gemm"):
        return False
    moe_utils.te_general_gemm = None
    REWRITES.installed.append("MoE router te_general_gemm=None (no TE)")
    return True


def install_biased_expert_fix() -> bool:
    """Biased experts of Megatron's local (non-TE) spec fail in every backward when their group has one rank.

    With tensor and expert parallel 1 a local expert's `RowParallelLinear` hands its output through
    `_ReduceFromModelParallelRegion`, which returns its input itself for a one-rank group (autograd makes that
    a view); the expert MLP then adds its bias in place (`output += bias * probs`, megatron/core/transformer/
    mlp.py), which autograd forbids on a custom Function's view. A one-rank reduce now returns a copy. Called
    only for MoE models with biased linears that do not use Transformer Engine."""
    # heavy: megatron-core; this module loads with torch alone and each patch imports what it patches
    from megatron.core.tensor_parallel import mappings

    region = mappings._ReduceFromModelParallelRegion
    if getattr(region.forward, "_megapilot_copy", False):
        return False
    original = region.forward

    def forward(ctx: Any, input_: torch.Tensor, group: Any) -> Any:
        if group is not None and group.size() == 1:
            return input_.clone()
        return original(ctx, input_, group)

    forward._megapilot_copy = True  # type: ignore[attr-defined]  # marks the patch as installed
    region.forward = staticmethod(forward)  # the patch is the point
    REWRITES.installed.append("one-rank expert reduce returns a copy (biased local experts)")
    return True


def ensure_optimizer_state(optimizer: MegatronOptimizer) -> None:
    """Give every torch Adam parameter a zero state before a checkpoint load.

    `DistributedOptimizer.state_dict()` asserts one common `step` over a non-empty state, which a
    fresh optimizer does not have yet; the loaded values then overwrite these zeros.
    """
    for inner in _inner_torch_optimizers(optimizer):
        for group in inner.param_groups:
            for param in group["params"]:
                state = inner.state[param]
                if "step" not in state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                    REWRITES.record("zero Adam state before load")


def _inner_torch_optimizers(optimizer: MegatronOptimizer) -> list[torch.optim.Optimizer]:
    chained = getattr(optimizer, "chained_optimizers", None)
    members = chained if chained is not None else [optimizer]
    inner = [getattr(member, "optimizer", None) for member in members]
    return [opt for opt in inner if isinstance(opt, torch.optim.Optimizer)]
