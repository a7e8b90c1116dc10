"""GPU catalog: hardware.json (vendor peaks, with sources) plus gpu_formats.json (block-scaled format peaks,
GPUs per node and per NVLink / Infinity Fabric domain, each with its source) and the scale-out figures below.

Look-ups accept the catalog name (`H100-SXM5-80GB`) or a short alias (`h100`), case-insensitive.
A user file (JSON list of GPUSpec fields, or hardware.json-style rows) overrides or extends it:
`MEGAPILOT_GPU_FILE=/abs/gpus.json` or `load_gpus(extra_file=...)`.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from megapilot.catalog.host import host_cpu, is_host_name
from megapilot.errors import MegapilotError, from_validation_error
from megapilot.spec.hardware import ClusterSpec, GPUSpec

GPU_FILE_ENV = "MEGAPILOT_GPU_FILE"


# The GPU's link to host memory, per GPU per direction (GB/s): PCIe Gen4 x16 carries 32, Gen5 x16 64 (PCI-SIG
# specifications: 16 and 32 GT/s per lane). A Grace superchip links its Grace CPU to its GPUs over NVLink-C2C,
# 900 GB/s bidirectional (NVIDIA GH200 / GB200 datasheets); on GB200 and GB300 one Grace serves two GPUs, so each
# gets 225 GB/s per direction when both offload at once, as data-parallel ranks do.
PCIE_GEN4_X16_GBPS = 32.0
PCIE_GEN5_X16_GBPS = 64.0
GRACE_C2C_PER_GPU_GBPS = 900.0 / 2 / 2

# Host memory per GPU (decimal GB), what activation offload parks activations in: an 8-GPU system's DRAM over its
# GPUs, 2 TB in the reference systems (NVIDIA DGX A100 80GB, DGX H100 / H200, DGX B200 and DGX B300 datasheets:
# "System memory 2TB"; AMD MI300-class OEM platforms ship alike, OEM-dependent), and a Grace superchip's 480 GB
# LPDDR5X over its two GPUs on GB200 / GB300 (NVL72 datasheets: up to 17 TB LPDDR5X over 36 Graces).
HGX_HOST_MEMORY_GB_PER_GPU = 2000.0 / 8
GRACE_HOST_MEMORY_GB_PER_GPU = 480.0 / 2


# The tensor-core time of one softmax exponential: dense BF16 MMA FLOPs per clock per SM over the special-function
# unit's (MUFU.EX2) exponentials per clock per SM. The SFU issues 16 a clock per SM on Ampere, Hopper and Blackwell
# (CUDA C++ Programming Guide, arithmetic-instruction throughput, "base-2 exponential"; FlashAttention-4, Zadouri et
# al. 2026, arXiv 2603.05451: "MUFU stayed at 16 ops/clock/SM" from H100 to B200) and 32 on Blackwell Ultra (NVIDIA,
# "Making Softmax More Efficient with NVIDIA Blackwell Ultra": SFU throughput doubled over Blackwell). The MMA side
# is the dense BF16 peak over SMs x boost clock: A100 312 TF / (108 x 1.41 GHz) = 2,048, H100 989 TF / (132 x 1.83
# GHz) = 4,096, B200 8,192 (FlashAttention-4: "8192 ops/clock/SM"). AMD CDNA: 2,048 per CU per clock on MI300X
# (1,307 TF / (304 x 2.1 GHz)), 4,096 on MI355X (2,500 TF / (256 x 2.4 GHz)), and transcendentals at a quarter of
# the 64 lanes' rate, 16 a clock per CU (GCN / CDNA ISA convention; commonly quoted, unverified for CDNA3/4).
MMA_FLOPS_PER_EXP_AMPERE = 2048 / 16
MMA_FLOPS_PER_EXP_HOPPER = 4096 / 16
MMA_FLOPS_PER_EXP_BLACKWELL = 8192 / 16
MMA_FLOPS_PER_EXP_BLACKWELL_ULTRA = 8192 / 32
MMA_FLOPS_PER_EXP_CDNA3 = 2048 / 16
MMA_FLOPS_PER_EXP_CDNA4 = 4096 / 16

# The tensor-core work one byte of shared-memory traffic stands for: dense BF16 MMA FLOPs per clock per SM (above)
# over the shared memory's 128 bytes per clock per SM, the same on Ampere, Hopper and Blackwell (32 banks of 4 bytes;
# FlashAttention-4: "SMEM bandwidth remained flat at 128 bytes/clock/SM" from H100 to B200). Blackwell doubled the
# MMAs beside it, so a kernel that reads its operands from shared memory at 40 FLOPs a byte, as the attention
# backward does (attention_bounds.backward_smem_bound), waits on it there and not on Hopper. AMD's LDS rates are not
# read here: not priced.
SMEM_BYTES_PER_CLOCK_PER_SM = 128
MMA_FLOPS_PER_SMEM_BYTE_AMPERE = 2048 / SMEM_BYTES_PER_CLOCK_PER_SM
MMA_FLOPS_PER_SMEM_BYTE_HOPPER = 4096 / SMEM_BYTES_PER_CLOCK_PER_SM
MMA_FLOPS_PER_SMEM_BYTE_BLACKWELL = 8192 / SMEM_BYTES_PER_CLOCK_PER_SM


@dataclass(frozen=True)
class _Topology:
    alias: str
    architecture: str
    scaleout_bw_gbps: float  # per GPU per direction: one 400 Gb/s NIC per GPU = 50 GB/s
    fill_in: dict[str, float]  # values hardware.json leaves null, with the reason in `note`
    note: str = ""
    host_link_gbps: float = PCIE_GEN5_X16_GBPS  # HGX B300's host CPUs are PCIe Gen5 too
    host_memory_gb: float = HGX_HOST_MEMORY_GB_PER_GPU
    mma_flops_per_exp: float | None = None  # see MMA_FLOPS_PER_EXP_*
    mma_flops_per_smem_byte: float | None = None  # see MMA_FLOPS_PER_SMEM_BYTE_*


# Fields neither data file carries. Scale-out is one NIC per GPU: 200 Gb/s HDR on A100 systems,
# 400 Gb/s NDR/CX7 on Hopper and MI300-class, 800 Gb/s CX8 on Blackwell Ultra.
GPU_TOPOLOGY: dict[str, _Topology] = {
    "A100-SXM4-80GB": _Topology("a100", "ampere", 25.0, {}, host_link_gbps=PCIE_GEN4_X16_GBPS,
                                 mma_flops_per_exp=MMA_FLOPS_PER_EXP_AMPERE,
                                 mma_flops_per_smem_byte=MMA_FLOPS_PER_SMEM_BYTE_AMPERE),
    "H100-SXM5-80GB": _Topology("h100", "hopper", 50.0, {}, mma_flops_per_exp=MMA_FLOPS_PER_EXP_HOPPER,
                                 mma_flops_per_smem_byte=MMA_FLOPS_PER_SMEM_BYTE_HOPPER),
    "H200-SXM-141GB": _Topology("h200", "hopper", 50.0, {}, mma_flops_per_exp=MMA_FLOPS_PER_EXP_HOPPER,
                                 mma_flops_per_smem_byte=MMA_FLOPS_PER_SMEM_BYTE_HOPPER),
    "H800-SXM5-80GB": _Topology(
        "h800", "hopper", 50.0,
        {"bf16_dense_tflops": 989.4, "fp8_dense_tflops": 1978.9, "hbm_bw_tbps": 3.35,
         "scaleup_bw_gbps_bidir_per_gpu": 400.0, "tdp_w": 700.0},
        note="H800 peaks and TDP taken as H100 SXM (same GH100 die); NVLink export-limited to 400 GB/s "
             "bidirectional",
        mma_flops_per_exp=MMA_FLOPS_PER_EXP_HOPPER, mma_flops_per_smem_byte=MMA_FLOPS_PER_SMEM_BYTE_HOPPER,
    ),
    "B200": _Topology("b200", "blackwell", 50.0, {}, mma_flops_per_exp=MMA_FLOPS_PER_EXP_BLACKWELL,
                       mma_flops_per_smem_byte=MMA_FLOPS_PER_SMEM_BYTE_BLACKWELL),
    "GB200": _Topology("gb200", "blackwell", 50.0, {}, host_link_gbps=GRACE_C2C_PER_GPU_GBPS,
                       host_memory_gb=GRACE_HOST_MEMORY_GB_PER_GPU,
                       mma_flops_per_exp=MMA_FLOPS_PER_EXP_BLACKWELL,
                       mma_flops_per_smem_byte=MMA_FLOPS_PER_SMEM_BYTE_BLACKWELL),
    "B300": _Topology("b300", "blackwell", 100.0, {}, mma_flops_per_exp=MMA_FLOPS_PER_EXP_BLACKWELL_ULTRA,
                       mma_flops_per_smem_byte=MMA_FLOPS_PER_SMEM_BYTE_BLACKWELL),
    "GB300": _Topology("gb300", "blackwell", 100.0, {}, host_link_gbps=GRACE_C2C_PER_GPU_GBPS,
                       host_memory_gb=GRACE_HOST_MEMORY_GB_PER_GPU,
                       mma_flops_per_exp=MMA_FLOPS_PER_EXP_BLACKWELL_ULTRA,
                       mma_flops_per_smem_byte=MMA_FLOPS_PER_SMEM_BYTE_BLACKWELL),
    "MI300X": _Topology(
        "mi300x", "cdna3", 50.0, {"scaleup_bw_gbps_bidir_per_gpu": 896.0},
        note="xGMI: 7 links x 128 GB/s (commonly quoted, unverified)", mma_flops_per_exp=MMA_FLOPS_PER_EXP_CDNA3,
    ),
    "MI325X": _Topology(
        "mi325x", "cdna3", 50.0, {"scaleup_bw_gbps_bidir_per_gpu": 896.0, "tdp_w": 1000.0},
        note="xGMI: 7 links x 128 GB/s (commonly quoted, unverified); TDP 1000 W (AMD Instinct MI325X product page, "
             "total board power)",
        mma_flops_per_exp=MMA_FLOPS_PER_EXP_CDNA3,
    ),
    "MI355X": _Topology(
        "mi355x", "cdna4", 50.0, {"scaleup_bw_gbps_bidir_per_gpu": 1075.0},
        note="xGMI 7 x ~153 GB/s (secondary source)", mma_flops_per_exp=MMA_FLOPS_PER_EXP_CDNA4,
    ),
}
# Peaks gpu_formats.json may give: it fills a hardware.json null, or replaces a value it names in `replaces`.
_PEAK_FIELDS = ("bf16_dense_tflops", "fp8_dense_tflops", "fp4_dense_tflops", "mxfp8_dense_tflops",
                "nvfp4_dense_tflops", "mxfp4_dense_tflops")


@lru_cache(maxsize=1)
def gpu_formats() -> dict[str, dict[str, Any]]:
    """gpu_formats.json's rows by GPU name (format peaks, GPUs per node and per scale-up domain, sources)."""
    text = resources.files("megapilot.catalog").joinpath("data").joinpath("gpu_formats.json").read_text()
    return {row["name"]: row for row in json.loads(text)["gpus"]}


def _catalog_values(row: dict[str, Any], topo: _Topology) -> dict[str, Any]:
    """hardware.json's row with the stated fill-ins and gpu_formats.json's figures laid over it."""
    value = {**row, **{k: v for k, v in topo.fill_in.items() if row.get(k) is None}}
    formats = gpu_formats().get(row["name"], {})
    replaced = formats.get("replaces", {})
    for key in _PEAK_FIELDS:
        if key not in formats:
            continue
        if value.get(key) not in (None, formats[key], replaced.get(key)):
            # A silent disagreement between the two files would hide which figure the estimate used.
            raise ValueError(f"gpu_formats.json gives {row['name']} {key}={formats[key]} but hardware.json has "
                             f"{value[key]}; name the old value under `replaces`")
        value[key] = formats[key]
    return value | {k: formats[k] for k in ("gpus_per_node", "scaleup_domain_gpus")}


def _row_to_spec(row: dict[str, Any]) -> GPUSpec:
    topo = GPU_TOPOLOGY.get(row["name"])
    if topo is None:  # a user row written directly in GPUSpec fields
        return GPUSpec(**row)
    value = _catalog_values(row, topo)
    formats_note = "format peaks and node/domain sizes: gpu_formats.json" if row["name"] in gpu_formats() else ""
    source = "; ".join(s for s in (row.get("verification", ""), topo.note, formats_note) if s)
    return GPUSpec(
        name=row["name"],
        alias=topo.alias,
        vendor=row["vendor"],
        architecture=topo.architecture,  # type: ignore[arg-type]  # GPUSpec validates the catalog's string
        bf16_dense_tflops=value["bf16_dense_tflops"],
        fp8_dense_tflops=value.get("fp8_dense_tflops"),
        fp4_dense_tflops=value.get("fp4_dense_tflops"),
        mxfp8_dense_tflops=value.get("mxfp8_dense_tflops"),
        nvfp4_dense_tflops=value.get("nvfp4_dense_tflops"),
        mxfp4_dense_tflops=value.get("mxfp4_dense_tflops"),
        hbm_gib=float(value["hbm_gb"]),  # HBM stacks are binary-sized: a "80 GB" part holds 80 GiB
        hbm_bw_tbps=value["hbm_bw_tbps"],
        scaleup_domain_gpus=value["scaleup_domain_gpus"],
        gpus_per_node=value["gpus_per_node"],
        scaleup_bw_gbps=value["scaleup_bw_gbps_bidir_per_gpu"] / 2,
        scaleout_bw_gbps=topo.scaleout_bw_gbps,
        host_link_gbps=topo.host_link_gbps,
        host_memory_gib=topo.host_memory_gb * 1e9 / 2**30,
        tdp_w=value.get("tdp_w"),  # hardware.json's tdp_w column, sourced with its row
        mma_flops_per_exp=topo.mma_flops_per_exp,
        mma_flops_per_smem_byte=topo.mma_flops_per_smem_byte,
        source=source,
    )


def _read_rows(path: Path) -> list[dict[str, Any]]:
    try:
        rows = json.loads(path.read_text())
    except FileNotFoundError:
        raise MegapilotError(
            f"no such file {path}", field="gpu_file", fix="pass an absolute path to a JSON file") from None
    except json.JSONDecodeError as exc:
        raise MegapilotError(f"{path} is not valid JSON ({exc})", field="gpu_file", fix="fix the JSON syntax") from None
    if not isinstance(rows, list):
        raise MegapilotError(f"{path} must hold a JSON list of GPUs", field="gpu_file", fix="wrap the rows in [...]")
    return rows


@lru_cache(maxsize=8)
def load_gpus(extra_file: str | None = None) -> dict[str, GPUSpec]:
    """All GPUs by catalog name; rows of `extra_file` (or $MEGAPILOT_GPU_FILE) override same-named ones."""
    bundled = json.loads(resources.files("megapilot.catalog").joinpath("data/hardware.json").read_text())
    gpus = {row["name"]: _row_to_spec(row) for row in bundled}
    extra = extra_file or os.environ.get(GPU_FILE_ENV)
    if extra:
        for row in _read_rows(Path(extra)):
            try:
                spec = _row_to_spec(row)
            except (KeyError, TypeError, ValueError) as exc:
                raise from_validation_error(exc, prefix="gpu_file") if hasattr(exc, "errors") else MegapilotError(
                    f"bad GPU row {row!r}: {exc}", field="gpu_file", fix="give every GPUSpec field") from None
            gpus[spec.name] = spec
    return gpus


# The system words around a GPU's name in vendors' tables: a DGX / HGX node, an NVL72 / NVL36 / NVL8 domain.
SYSTEM_WORDS = re.compile(r"^(?:dgx|hgx)[-_ ]*|[-_ ]*nvl\d+$")


def cluster_of(name: str, gpus: int, gpus_per_node: int | None = None) -> ClusterSpec:
    """`gpus` of the GPU `name` as a cluster (`ClusterSpec.from_gpu_count`); on this machine's CPU each rank is priced
    at the rate the ranks beside it leave it (`host.rank_matmul_tflops`)."""
    cluster = ClusterSpec.from_gpu_count(get_gpu(name), gpus, gpus_per_node)
    if is_host_name(name):
        cluster = cluster.model_copy(update={"gpu": host_cpu(ranks_per_node=cluster.gpus_per_node)})
    return cluster


def get_gpu(name: str, extra_file: str | None = None) -> GPUSpec:
    """Find a GPU by catalog name or alias (case-insensitive); `cpu` is this machine's CPU, measured (host.py)."""
    key = name.strip().lower()
    if is_host_name(key):
        return host_cpu()
    system = SYSTEM_WORDS.sub("", key)  # "DGX-B200", "GB200 NVL72": the GPU the system is built of
    for spec in load_gpus(extra_file).values():
        if key in (spec.name.lower(), spec.alias) or system == spec.alias:
            return spec
    known = ", ".join(sorted(s.alias for s in load_gpus(extra_file).values()))
    raise MegapilotError(f"unknown GPU {name!r}", field="gpu", fix=f"use one of: {known}")
