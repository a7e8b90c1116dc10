"""Launch options used by the golden files: fixed absolute paths, no existence check (remote cluster)."""

from __future__ import annotations

from megapilot.launch import LaunchOptions
from tests.launch.plans import GOLDEN_PLANS

LAUNCHERS = ("torchrun", "slurm", "primus")


def golden_options(case: str, launcher: str) -> LaunchOptions:
    amd = GOLDEN_PLANS[case].cluster.gpu.vendor == "AMD"
    image = "rocm/megatron-lm:v25.9" if amd else "nvcr.io/nvidia/pytorch:25.09-py3"
    return LaunchOptions(
        launcher=launcher,  # type: ignore[arg-type]  # one of the launchers
        data_path="/lustre/data/fineweb/fineweb_text_document",
        tokenizer_model="/lustre/tokenizers/" + case.split("_")[0],
        save=f"/lustre/checkpoints/{case}",
        megatron_path="/opt/Megatron-LM",
        script_path=f"/lustre/jobs/{case}/train.sh",
        job_name=case,
        container_image=image if launcher == "slurm" else None,
        container_mounts=("/lustre:/lustre",) if launcher == "slurm" else (),
        check_paths_exist=False,
    )
