"""Launch: plan -> Megatron-LM flags -> torchrun / SLURM sbatch scripts and Primus experiments, checked.

    from megapilot.launch import LaunchOptions, render_launch
    launch = render_launch(plan, LaunchOptions(launcher="slurm", mock_data=True, ...))
    launch.script, launch.megatron_args, launch.env
"""

from megapilot.launch.checks import check_megatron_args, check_world
from megapilot.launch.flags import ArgSection, megatron_arg_sections, render_megatron_args
from megapilot.launch.megatron_args import MEGATRON_COMMIT, MEGATRON_RELEASE, pinned_flags
from megapilot.launch.options import LaunchOptions, LaunchScript
from megapilot.launch.render import render_launch

__all__ = [
    "MEGATRON_COMMIT",
    "MEGATRON_RELEASE",
    "ArgSection",
    "LaunchOptions",
    "LaunchScript",
    "check_megatron_args",
    "check_world",
    "megatron_arg_sections",
    "pinned_flags",
    "render_launch",
    "render_megatron_args",
]
