"""The flag edits that turn a launch into a proposed layout, from the launch package's own rendering.

A proposal is the difference between what `megapilot script` writes for the proposed layout and what
it writes for the current one. Both lists come from `megapilot.launch`, the one place that knows every
companion flag: switching to Megatron-FSDP brings the sharding strategy, the checkpoint format and
whatever else the launch side requires with it (and drops `CUDA_DEVICE_MAX_CONNECTIONS`), and switching
something off removes the flags that only it needed. The edits are stated against the user's own
script: a flag it has is set, one it lacks is added, and a flag it spells another way
(`--recompute-granularity selective` for `--recompute-activations`) is removed with its twin.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from megapilot.catalog.gpus import get_gpu
from megapilot.diagnose.findings import Fix
from megapilot.diagnose.flags import FSDP_SWITCHES, LaunchFlags, RunConfig, apply_fixes, collect_flags
from megapilot.errors import MegapilotError
from megapilot.launch.checks import check_megatron_args, combination_refusals
from megapilot.launch.environment import launch_environment
from megapilot.launch.flags import megatron_arg_sections
from megapilot.launch.options import LaunchOptions
from megapilot.spec import ClusterSpec, GPUSpec, ParallelConfig, SavedPlan, TrainingSpec

# Flags that say the same thing in two spellings: when one is set or removed, the other must go.
_SAME_SETTING: tuple[frozenset[str], ...] = (
    frozenset({"--recompute-activations", "--recompute-granularity"}),
    frozenset({"--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank"}),
    frozenset(FSDP_SWITCHES),
)
# Without the GPU type, only the sections that follow from the layout alone are rendered: the precision,
# performance and environment choices depend on the vendor and generation and would be guessed.
_LAYOUT_SECTIONS = ("parallelism", "Megatron-FSDP", "activation recompute", "training", "checkpoints")
# Render the layout sections when the GPU is unknown (nothing GPU-specific is kept): the first that runs the launch's
# precision, since the renderer refuses one its GPU lacks (an H100 has no MXFP8 or NVFP4, a B200 no MXFP4).
_STAND_IN_GPUS = ("h100", "b200", "mi355x")


@dataclass(frozen=True)
class RenderedLaunch:
    """What `megapilot script` would write for one layout: Megatron flags (with their section) and exports."""

    flags: dict[str, str | None]
    section_of: dict[str, str]
    env: dict[str, str | None] = field(default_factory=dict)  # None: the script unsets it
    env_reason: dict[str, str] = field(default_factory=dict)


def rendered_launch(config: RunConfig, parallel: ParallelConfig, training: TrainingSpec) -> RenderedLaunch:
    """The launch package's flags and environment for `parallel`, checked by the same rules `megapilot script`
    applies before writing (Megatron's validate_args and TransformerConfig); MegapilotError where it refuses."""
    assert config.model is not None
    cluster = config.cluster or stand_in_cluster(config, training)
    plan = SavedPlan(model=config.model, cluster=cluster, training=training, parallel=parallel)
    # Data flags do not depend on the layout (mock data renders anywhere); the checkpoint directories do: a run
    # that saves or loads keeps a distributed format, which some overlaps are refused beside.
    options = LaunchOptions(mock_data=True, save=config.flags.get("--save"), load=config.flags.get("--load"))
    sections = megatron_arg_sections(plan, options)
    check_megatron_args([word for section in sections for word in section.args], cluster.gpu)
    flags: dict[str, str | None] = {}
    section_of: dict[str, str] = {}
    for section in sections:
        if config.gpu is None and not section.title.startswith(_LAYOUT_SECTIONS):
            continue
        for name, value in collect_flags(section.args).values.items():
            flags[name] = value
            section_of[name] = section.title.split(":")[0]
    if config.gpu is None:
        return RenderedLaunch(flags=flags, section_of=section_of)
    env = launch_environment(plan, options)
    return RenderedLaunch(flags=flags, section_of=section_of, env={v.name: None if v.unset else v.value for v in env},
                          env_reason={v.name: v.why for v in env})


def stand_in_cluster(config: RunConfig, training: TrainingSpec) -> ClusterSpec:
    """The launch's GPU count on a stand-in GPU that runs `training`'s precision, for a launch whose GPU is unknown:
    what renders and checks its layout, never what prices it."""
    return ClusterSpec.from_gpu_count(_stand_in_gpu(training), config.world_size)


def _stand_in_gpu(training: TrainingSpec) -> GPUSpec:
    gpus = [get_gpu(name) for name in _STAND_IN_GPUS]
    return next((gpu for gpu in gpus if _runs_precision(gpu, training)), gpus[0])


def _runs_precision(gpu: GPUSpec, training: TrainingSpec) -> bool:
    """Whether `GPUSpec.check_precision`, the rule the renderer applies, lets this GPU run the precision."""
    try:
        gpu.check_precision(training.precision, training.fp8_recipe)
    except MegapilotError:
        return False
    return True


def layout_flag_changes(config: RunConfig, parallel: ParallelConfig, training: TrainingSpec | None = None, *,
                        label: str, reasons: Mapping[str, str] | None = None) -> list[Fix]:
    """Every edit that takes the launch from its current layout to `parallel` (and `training`).

    `reasons` gives the why of the flags the proposal is about; the companion flags get theirs from
    the section they belong to. MegapilotError when the launch package refuses either layout.
    """
    assert config.parallel is not None and config.training is not None
    training = training or config.training
    now = rendered_launch(config, config.parallel, config.training)
    then = rendered_launch(config, parallel, training)
    why = dict(reasons or {})
    fixes = _with_companions(config, training, then, _flag_edits(config, now, then, label, why), label)
    return fixes + _env_edits(now, then, label, why)


def _flag_edits(config: RunConfig, now: RenderedLaunch, then: RenderedLaunch, label: str,
                why: dict[str, str]) -> list[Fix]:
    have = config.flags
    wanted = {name: value for name, value in then.flags.items()
              if name not in now.flags or now.flags[name] != value}
    dropped = [name for name in now.flags if name not in then.flags]
    fixes: list[Fix] = []
    for name, value in wanted.items():
        if have.has(name) and have.values[name] == value:
            continue
        reason = why.get(name) or f"{then.section_of[name]} flag of {label}"
        fixes.append(Fix(action="set" if have.has(name) else "add", flag=name, value=value, reason=reason))
    removed: set[str] = set()
    for name in [*dropped, *wanted]:
        for spelling in _spellings(name):
            keep = spelling in then.flags
            if have.has(spelling) and not keep and spelling not in removed and (spelling != name or name in dropped):
                removed.add(spelling)
                fixes.append(Fix(action="remove", flag=spelling, value=None,
                                 reason=why.get(spelling) or f"not part of {label}"))
    return fixes


def _with_companions(config: RunConfig, training: TrainingSpec, then: RenderedLaunch, fixes: list[Fix],
                     label: str) -> list[Fix]:
    """The edits, with the companions Megatron requires beside them that the user's own flags lack.

    The edits are a difference of two renderings, so a flag both renderings write (`--overlap-param-gather`) is
    not among them even where an edited flag needs it (`--overlap-param-gather-with-optimizer-step`) and the
    user's script does not have it. While the edited flags meet a refusal of Megatron's combination rules that
    the user's own flags do not, the rendered flags the user lacks are added one at a time, each kept only where
    it lifts the first of those refusals without adding one (a companion can need its own:
    `--overlap-param-gather` needs `--overlap-grad-reduce`). MegapilotError when none does.
    """
    gpu = config.gpu or _stand_in_gpu(training)  # the proposal's precision, which the edits may change
    before = {exc.problem for exc in _refusals(config.flags, gpu)}

    def new_refusals(edits: list[Fix]) -> list[MegapilotError]:
        return [exc for exc in _refusals(apply_fixes(config.flags, edits), gpu) if exc.problem not in before]

    refused = new_refusals(fixes)
    missing = [name for name in then.flags if not apply_fixes(config.flags, fixes).has(name)]
    while refused:
        for name in missing:
            companion = Fix(action="add", flag=name, value=then.flags[name],
                            reason=f"Megatron requires it beside {label} ({refused[0].problem})")
            after = new_refusals([*fixes, companion])
            if refused[0].problem not in {exc.problem for exc in after} and len(after) <= len(refused):
                fixes, refused = [*fixes, companion], after
                missing.remove(name)
                break
        else:
            raise refused[0]
    return fixes


def _refusals(flags: LaunchFlags, gpu: GPUSpec) -> list[MegapilotError]:
    values = {name: value.split() if value else [] for name, value in flags.values.items()}
    return combination_refusals(values, gpu)


def _spellings(name: str) -> frozenset[str]:
    for group in _SAME_SETTING:
        if name in group:
            return group
    return frozenset({name})


def _env_edits(now: RenderedLaunch, then: RenderedLaunch, label: str, why: dict[str, str]) -> list[Fix]:
    """Exports the proposal sets or changes, variables it unsets, and exports it no longer writes."""
    fixes: list[Fix] = []
    for name, value in then.env.items():
        if name in now.env and now.env[name] == value:
            continue
        reason = why.get(name) or then.env_reason[name]
        if value is None:
            fixes.append(Fix(action="remove", flag=name, value=None, kind="env", reason=reason))
        else:
            fixes.append(Fix(action="set", flag=name, value=value, kind="env", reason=reason))
    fixes += [Fix(action="remove", flag=name, value=None, kind="env",
                  reason=why.get(name) or f"the launch of {label} does not export it")
              for name, value in now.env.items() if name not in then.env and value is not None]
    return fixes
