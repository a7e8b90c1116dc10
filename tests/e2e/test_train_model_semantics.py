"""The embedded trainer trains small variants of each model family with the flags `script` renders.

Two one-process runs on CPU (start-up dominates, so each run carries several families' semantics):
- Llama 3.1 style: GQA, Llama 3 RoPE scaling, a sliding window, per-head q/k norms (Qwen3);
- DeepSeek-V3 style: MLA with its q/kv latent norms and YaRN, a dense first layer, a sigmoid router with
  the aux-loss-free expert bias, 4 groups of which 2 are eligible, top-k scaling 2.5, an fp32 gate, and one
  MTP module with its loss scale.
Each script is rendered by `render_launch` (what `megapilot script --entrypoint megapilot` writes), run with
bash as a user would, and its log read: three iterations with finite losses, and the parameter count the
trainer reports equals megapilot's count of the same spec (so the flags built that model).
"""

from __future__ import annotations

import math
import os
import re
import sys
from pathlib import Path

import pytest

from megapilot.catalog.gpus import get_gpu
from megapilot.estimate.params import count_params
from megapilot.launch import LaunchOptions, render_launch
from megapilot.spec import ClusterSpec, MLASpec, ModelSpec, MoESpec, ParallelConfig, SavedPlan, TrainingSpec
from megapilot.spec.model import Llama3RopeScaling, YarnRopeScaling
from tests.e2e.process_tree import run_tree

pytestmark = pytest.mark.slow
pytest.importorskip("megatron.core")

ITERATIONS = 3
LOSS = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*?lm loss: ([0-9.eE+-]+|nan|inf)")
PARAMS = re.compile(r"number of parameters on \(tensor, pipeline\) model parallel rank \(0, 0\): (\d+)")

LLAMA_STYLE = ModelSpec(
    name="tiny-llama31", num_layers=2, hidden_size=64, ffn_hidden_size=160, num_attention_heads=4,
    num_query_groups=2, vocab_size=512, max_position_embeddings=128, rotary_base=500000,
    rope_scaling=Llama3RopeScaling(factor=8.0), sliding_window=32, qk_layernorm=True,
)
DEEPSEEK_STYLE = ModelSpec(
    name="tiny-deepseek-v3", num_layers=3, hidden_size=64, ffn_hidden_size=160, num_attention_heads=4,
    vocab_size=512, max_position_embeddings=128, norm_epsilon=1e-6,
    rope_scaling=YarnRopeScaling(factor=4.0, original_max_position_embeddings=4096, mscale=1.0, mscale_all_dim=1.0),
    mla=MLASpec(q_lora_rank=32, kv_lora_rank=16, qk_head_dim=16, qk_pos_emb_head_dim=8, v_head_dim=16),
    moe=MoESpec(num_experts=8, router_topk=4, moe_ffn_hidden_size=32, shared_expert_ffn_hidden_size=32,
                first_k_dense_layers=1, router_score_function="sigmoid", router_expert_bias=True,
                router_num_groups=4, router_group_topk=2, router_topk_scaling_factor=2.5, router_dtype="fp32",
                load_balancing_type="seq_aux_loss", aux_loss_coeff=1e-3),
    mtp_num_layers=1, mtp_loss_scaling_factor=0.3,
)


def _train(tmp_path: Path, model: ModelSpec) -> tuple[str, list[str]]:
    plan = SavedPlan(model=model, cluster=ClusterSpec(gpu=get_gpu("h100"), num_nodes=1, gpus_per_node=1),
                     training=TrainingSpec(seq_length=64, global_batch_size=2, train_iters=ITERATIONS, lr=3e-3),
                     parallel=ParallelConfig.for_world(1, mbs=2, recompute="none"))
    script = tmp_path / "train.sh"
    launch = render_launch(plan, LaunchOptions(mock_data=True, entrypoint="megapilot", cpu=True,
                                               python=sys.executable, script_path=str(script)))
    script.write_text(launch.script)
    log_path = tmp_path / "train.log"
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    returncode = run_tree(["bash", str(script)], log_path=log_path, cwd=tmp_path, env=env, timeout_s=240)
    output = log_path.read_text()
    assert returncode == 0, output[-3000:]
    return output, launch.megatron_args


def _assert_trained_the_spec(output: str, model: ModelSpec, routing_bias_buffers: int = 0) -> None:
    losses = {int(i): float(v) for i, v in LOSS.findall(output)}
    assert sorted(losses) == list(range(1, ITERATIONS + 1)), output[-2000:]
    assert all(math.isfinite(v) for v in losses.values()), losses
    reported = int(PARAMS.search(output).group(1))  # type: ignore[union-attr]  # a miss fails the test
    assert reported + routing_bias_buffers == count_params(model, padded_vocab=True).total


def test_llama31_rope_scaling_sliding_window_and_qk_norm_train(tmp_path: Path) -> None:
    output, args = _train(tmp_path, LLAMA_STYLE)
    assert {"--use-rope-scaling", "--qk-layernorm"} <= set(args)
    assert args[args.index("--window-size") + 1] == "31,0"
    _assert_trained_the_spec(output, LLAMA_STYLE)


def test_mla_yarn_sigmoid_grouped_router_with_expert_bias_and_mtp_train(tmp_path: Path) -> None:
    output, args = _train(tmp_path, DEEPSEEK_STYLE)
    for flag, value in (("--rope-type", "yarn"), ("--moe-router-score-function", "sigmoid"),
                        ("--moe-router-num-groups", "4"), ("--moe-router-group-topk", "2"),
                        ("--moe-router-topk-scaling-factor", "2.5"), ("--mtp-num-layers", "1"),
                        ("--mtp-loss-scaling-factor", "0.3"), ("--moe-layer-freq", "([0]*1+[1]*2)")):
        assert args[args.index(flag) + 1] == value, flag
    assert {"--multi-latent-attention", "--qk-layernorm", "--moe-router-enable-expert-bias"} <= set(args)
    # Megatron keeps the routing bias as a buffer; megapilot counts it as the HF checkpoint does
    # (two MoE layers and the MTP layer, which copies the last layer's kind).
    _assert_trained_the_spec(output, DEEPSEEK_STYLE, routing_bias_buffers=3 * 8)
