"""Helpers for tests that start from the real CVS configs in tests/data/cvs (copied into tmp_path)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

CVS_DIR = Path(__file__).resolve().parents[1] / "data" / "cvs"
SINGLE_8B = "mi3xx_megatron_llama-3.1-8b_single.json"
DISTRIBUTED_70B = "mi3xx_megatron_llama-3.3-70b_distributed.json"
LLAMA_405B = "mi3xx_megatron_llama-3.1-405b_distributed.json"
THRESHOLDS = {SINGLE_8B: "mi325x_megatron_llama-3.1-8b_single_threshold.json",
              DISTRIBUTED_70B: "mi325x_megatron_llama-3.3-70b_distributed_threshold.json"}


def raw_cvs(name: str) -> dict:
    return json.loads((CVS_DIR / name).read_text())


def filled_in(raw: dict, *, gpu: str = "MI325X", threshold: str = "t_threshold.json") -> dict:
    """What an operator does to a CVS template: every `<changeme>` replaced with a real value."""
    raw["gpu_name"] = gpu
    raw["threshold_json"] = threshold
    raw["container"]["image"] = "rocm/megatron-lm:v25.9"
    raw["train_params"]["training_iterations"] = "20"
    raw["container"]["env"] = {k: v.replace(" <changeme>", "").replace("<changeme>", "10.0.0.1")
                               for k, v in raw["container"]["env"].items()}
    return raw


def write_suite(tmp_path: Path, raw: dict, name: str, *, config_name: str = "suite.json") -> Path:
    """The config and its CVS threshold file (as `t_threshold.json`) in tmp_path; returns the config path."""
    shutil.copyfile(CVS_DIR / THRESHOLDS[name], tmp_path / "t_threshold.json")
    path = tmp_path / config_name
    path.write_text(json.dumps(raw))
    return path


# ---- every CVS Megatron config, filled in as CVS's docs say --------------------------------------------------
# docs/reference/configuration-files/training/megatron.rst: replace every `<changeme>` (GPU, sibling threshold file,
# container image, training iterations, NCCL/RDMA fields), keep the sibling threshold file beside the config; the
# cluster file lists the nodes (NNODES and NODE_RANK come from it). With checkpoint.enforce false, CVS drops the
# checkpoint directory and its `<changeme>:<changeme>` volume, and so does megapilot: they are left as shipped.
MEGATRON_LM_IMAGE = "rocm/megatron-lm:v25.9"
PRIMUS_IMAGE = "rocm/primus:v25.9"
# A value CVS ships as `<example> <changeme>` keeps the example; a bare `<changeme>` takes the cluster's value.
ENV_VALUES = {"NCCL_IB_HCA": "bnxt_re0,bnxt_re1,bnxt_re2,bnxt_re3,bnxt_re4,bnxt_re5,bnxt_re7,bnxt_re8",
              "NCCL_SOCKET_IFNAME": "enp193s0f1np1", "GLOO_SOCKET_IFNAME": "enp193s0f1np1"}


def cvs_configs() -> list[str]:
    """Every config file copied from CVS's megatron folder (the unified suites' files, not the legacy forms)."""
    return sorted(p.name for p in CVS_DIR.glob("mi*_megatron_*.json") if not p.name.endswith("_threshold.json"))


def cluster_json(nodes: int) -> dict:
    """CVS's cluster file with its placeholders replaced: `nodes` hosts, node 0 first (the master)."""
    hosts = [f"10.0.0.{i + 1}" for i in range(nodes)]
    return {"username": "ops", "priv_key_file": "/home/{user-id}/.ssh/id_rsa", "head_node_dict": {"mgmt_ip": hosts[0]},
            "env_vars": {}, "node_dict": {h: {"bmc_ip": "NA", "vpc_ip": h} for h in hosts}}


def filled_as_documented(raw: dict, *, gpu: str, image: str, nodes: int) -> dict:
    """A CVS template as an operator fills it in: the GPU, its sibling threshold file, an image, 30 iterations
    (the docs' example), and the cluster's values for the NCCL fields."""
    if raw["gpu_name"] == "<changeme>":
        raw["gpu_name"] = gpu
    if raw["threshold_json"] == "<changeme>":
        raw["threshold_json"] = threshold_file(raw, gpu)
    raw["container"]["image"] = image
    if raw["train_params"]["training_iterations"] == "<changeme>":
        raw["train_params"]["training_iterations"] = "30"
    env = raw["container"]["env"]
    for name, value in env.items():
        if value == "<changeme>":
            env[name] = {"MASTER_ADDR": "10.0.0.1", "NNODES": str(nodes)}.get(name) or ENV_VALUES[name]
        else:
            env[name] = value.replace(" <changeme>", "")
    return raw


def threshold_file(raw: dict, gpu: str) -> str:
    """The sibling `<gpu>_megatron_<model>_<mode>_threshold.json` CVS's `_threshold_json_comment` points at."""
    model = {"llama3.1_8B": "llama-3.1-8b", "llama3.3_70B": "llama-3.3-70b", "llama3.1_405B": "llama-3.1-405b",
             "deepseek_v2_lite": "deepseek-v2-lite"}[raw["train_params"]["model_name"]]
    mode = "distributed" if "scaling_baseline" in raw else "single"
    return f"{gpu.lower()}_megatron_{model}_{mode}_threshold.json"


def write_filled(tmp_path: Path, name: str, *, gpu: str, image: str, nodes: int, edit=None) -> tuple[Path, Path]:
    """`name` filled in as documented (then `edit`ed), its sibling threshold file and a cluster file of `nodes` hosts,
    in tmp_path: (config, cluster)."""
    raw = filled_as_documented(raw_cvs(name), gpu=gpu, image=image, nodes=nodes)
    if edit is not None:
        edit(raw)
    tmp_path.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(CVS_DIR / raw["threshold_json"], tmp_path / raw["threshold_json"])
    config, cluster = tmp_path / "suite.json", tmp_path / "cluster.json"
    config.write_text(json.dumps(raw))
    cluster.write_text(json.dumps(cluster_json(nodes)))
    return config, cluster


def two_host_suite(tmp_path: Path, executor: str, **megapilot: object):
    """The 8B single-node CVS config on `executor`, with a two-host SSH cluster file (head node 10.0.0.2, port
    2222), loaded."""
    from megapilot.suite.config import load_suite

    raw = filled_in(raw_cvs(SINGLE_8B))
    raw["megapilot"] = {"executor": executor, **megapilot}
    config = write_suite(tmp_path, raw, SINGLE_8B)
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({
        "username": "ops", "priv_key_file": "/home/ops/.ssh/id_ed25519", "head_node_dict": {"mgmt_ip": "10.0.0.2"},
        "node_dict": {"10.0.0.1": {"bmc_ip": "NA", "vpc_ip": "192.168.0.1"},
                      "10.0.0.2": {"bmc_ip": "NA", "vpc_ip": "192.168.0.2"}},
        "ssh_port": 2222, "ssh_options": ["StrictHostKeyChecking=accept-new"]}))
    return load_suite(config, cluster)
