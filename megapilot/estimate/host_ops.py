"""The ops a CPU rank's thread runs in line: what paces a small model's step on a CPU beside its FLOPs.

On a GPU the host queues kernels ahead of the device, and a kernel's fixed cost is the fitted per-kernel overhead
over Transformer Engine's kernel counts (`latency.layer_kernels`). On a CPU each ATen op runs on the rank's one
thread as the Python issuing it reaches it, so every op's dispatch, autograd bookkeeping and the Python around it
add to the step: a step costs its ops times one op's cost (`GPUSpec.host_op_s`, measured by `catalog.host`) beside
its work.

The counts are the embedded trainer's (Megatron-Core 0.16.1's local layers under the trainer's CPU mode, one rank,
fp32), counted op by op with a dispatch mode by `bench/trainer_cpu/op_counts.py` (results in `op_counts.json`
beside it), at two and four layers, four and eight micro-batches and two and four steps, and solved exactly for the
form below; each layer feature is toggled alone from the tiny GPT, so each delta here is that feature's own ops.
They are properties of the code path, not of this machine: the same on any CPU.

    a micro-batch, per layer      LAYER_OPS + the features' deltas (forward and backward)
    a micro-batch, once           MICRO_BATCH_OPS (embedding, loss, output layer, the schedule) + the final norm's
    a step                        STEP_OPS + LAYER_STEP_OPS a layer + OPS_PER_PARAMETER_TENSOR for each parameter
                                  tensor (torch's Adam updates tensor by tensor on CPU; the gradient clipping and
                                  the DDP buffers' bookkeeping per tensor)

Layers the counts do not cover (experts, MLA, Mamba) are counted as the dense layer nearest them: a floor
(`bench/calibration/physics.md`, "The ops a CPU rank runs in line").

The same runs count the elements the element-wise ops write (every op but the GEMMs, the views and the
allocations: `trainer.op_probe.OpCounter`). One CPU thread runs those per element, not at the memory's stream rate,
so they are priced per element (`GPUSpec.host_element_s`, measured by the probe). Solved from the bench's shape
variants (hidden size, FFN width, sequence length and heads each doubled alone), a layer writes per micro-batch

    19 x tokens x hidden + 3 x tokens x FFN + 9 x scores (micro-batch x heads x s x s) + 1 x its parameters

(within 0.3 % of every variant's count; the parameters' one: each micro-batch's gradient added into DDP's buffer),
and a step 11 elements a parameter (the optimizer's update, the gradient clipping and the buffers' zeroing).
"""

from __future__ import annotations

from megapilot.estimate.params import layer_params
from megapilot.spec.model import ModelSpec
from megapilot.spec.parallel import ParallelConfig

# The tiny GPT's layer (LayerNorm, biases, GELU MLP, learned positions, multi-head attention), forward + backward.
LAYER_OPS = 165.0
# Each feature's change to that, measured alone (the counts differ by exactly this at every shape):
# one norm as RMSNorm instead of LayerNorm (Megatron's local RMSNorm is composed of torch ops; LayerNorm is one);
RMSNORM_OPS_DELTA = 19.0
# a SwiGLU MLP instead of GELU (the gate's chunk, SiLU and product, and their gradients);
SWIGLU_OPS_DELTA = 6.0
# linear layers without biases (each bias's add in the forward and its gradient's sum in the backward gone);
NO_BIAS_OPS_DELTA = -23.0
# rotary position embeddings instead of learned ones (q and k rotated, forward and backward);
ROPE_OPS_DELTA = 48.0
# grouped-query attention (the K/V heads expanded to the query heads and the gradients summed back).
GQA_OPS_DELTA = 16.0
# Per micro-batch outside the layers: embedding lookup, the output layer, the loss, the schedule's bookkeeping
# (with a LayerNorm as the final norm and learned positions).
MICRO_BATCH_OPS = 123.0
# The rotary table instead of the learned positions' lookup, per micro-batch.
ROPE_MICRO_BATCH_OPS_DELTA = -6.0
# Per step: the optimizer's and the schedule's fixed ops; per layer; per parameter tensor.
STEP_OPS = 25.0
LAYER_STEP_OPS = 4.0
OPS_PER_PARAMETER_TENSOR = 13.0


# Elements the element-wise ops write, forward and backward (bench/trainer_cpu/op_counts.json, "elements"): a
# layer's per micro-batch, by what they scale with: the norms, residual and bias adds and the q/k/v copies (tokens x
# hidden); the GELU, its gradient and fc1's bias add (tokens x FFN); the mask, the softmax and their gradients over
# the scores; each gradient added into DDP's main_grad buffer (parameters).
LAYER_ELEMENTS_PER_TOKEN_HIDDEN = 19.0
LAYER_ELEMENTS_PER_TOKEN_FFN = 3.0
LAYER_ELEMENTS_PER_SCORE = 9.0
LAYER_ELEMENTS_PER_PARAMETER = 1.0
# Each feature's change, measured alone at the bench's shape: RMSNorm composed of torch ops (per norm, tokens x
# hidden); SwiGLU's chunk, SiLU and product with their gradients (tokens x FFN); no biases: each bias add's output
# gone (tokens x the widths with a bias: QKV 3h, the projection h, fc1 FFN, fc2 h); RoPE: q and k rotated (tokens x
# the rotated width); GQA: the K/V heads expanded to the query heads and the gradients summed back (tokens x hidden).
RMSNORM_ELEMENTS_PER_TOKEN_HIDDEN = 10.0
SWIGLU_ELEMENTS_PER_TOKEN_FFN = 7.0
BIAS_ELEMENTS_PER_OUTPUT = 1.0
ROPE_ELEMENTS_PER_ROTATED_VALUE = 13.0
GQA_ELEMENTS_PER_TOKEN_HIDDEN = 3.0
# Per micro-batch outside the layers (solved from the tiny GPT, its hidden size and its sequence doubled): the
# embedding's and learned positions' adds (tokens x hidden), the loss over the logits (tokens x padded vocabulary),
# the embedding's gradient and its accumulation (the embedding's parameters); RoPE's table in place of the learned
# positions (tokens x hidden).
MICRO_BATCH_ELEMENTS_PER_TOKEN_HIDDEN = 9.0
MICRO_BATCH_ELEMENTS_PER_LOGIT = 5.26
MICRO_BATCH_ELEMENTS_PER_EMBEDDING_PARAMETER = 2.68
ROPE_MICRO_BATCH_ELEMENTS_PER_TOKEN_HIDDEN = -4.0
# Per step: the optimizer's update, the clipping and the buffers' zeroing, per parameter on the rank.
STEP_ELEMENTS_PER_PARAMETER = 11.0


def layer_ops(model: ModelSpec, layer_index: int) -> float:
    """Ops one layer runs for one micro-batch, forward and backward."""
    ops = LAYER_OPS
    if model.normalization == "RMSNorm":
        ops += 2 * RMSNORM_OPS_DELTA
    if model.gated_mlp:
        ops += SWIGLU_OPS_DELTA
    if not model.add_bias_linear:
        ops += NO_BIAS_OPS_DELTA
    if model.position_embedding == "rope":
        ops += ROPE_OPS_DELTA
    if model.is_gqa:
        ops += GQA_OPS_DELTA
    return ops


def micro_batch_ops(model: ModelSpec) -> float:
    """Ops a micro-batch runs outside the layers: embedding, final norm, output layer, loss, schedule."""
    ops = MICRO_BATCH_OPS + (RMSNORM_OPS_DELTA if model.normalization == "RMSNorm" else 0.0)
    return ops + (ROPE_MICRO_BATCH_OPS_DELTA if model.position_embedding == "rope" else 0.0)


def layer_parameter_tensors(model: ModelSpec) -> int:
    """Parameter tensors of a dense layer as Megatron's local spec holds them: two norms (LayerNorm's weight and
    bias, RMSNorm's weight), QKV and the output projection, fc1 (the gate fused in) and fc2, each weight with its
    bias where the model has biases."""
    norms = 2 * (2 if model.normalization == "LayerNorm" else 1)
    linears = 4 * (2 if model.add_bias_linear else 1)
    return norms + linears + (2 if model.qk_layernorm else 0)


def parameter_tensors(model: ModelSpec) -> int:
    """Every parameter tensor: the layers', the embedding's, learned positions', the final norm's and an untied
    output layer's."""
    outside = 1 + (1 if model.position_embedding == "learned_absolute" else 0) \
        + (2 if model.normalization == "LayerNorm" else 1) + (0 if model.tie_embeddings else 1)
    return model.num_layers * layer_parameter_tensors(model) + outside


def step_ops(model: ModelSpec, p: ParallelConfig) -> float:
    """Ops a rank runs once a step (the optimizer, the schedule), for its pipeline stage's share of the tensors."""
    return STEP_OPS + (LAYER_STEP_OPS * model.num_layers + OPS_PER_PARAMETER_TENSOR * parameter_tensors(model)) / p.pp


def layer_elements(model: ModelSpec, layer_index: int, p: ParallelConfig, seq_length: int) -> float:
    """Elements one layer's element-wise ops write for one micro-batch on a rank, forward and backward. TP splits
    the FFN, the heads and the weights; the tokens x hidden work (norms, residual) is taken whole on every rank."""
    h, ffn = model.hidden_size, model.layer_ffn_hidden_size(layer_index)
    tokens = p.mbs * seq_length / p.cp
    scores = p.mbs * model.num_attention_heads / p.tp * (seq_length / p.cp) * seq_length
    weights = _layer_weights(model, layer_index, p)
    elements = (LAYER_ELEMENTS_PER_TOKEN_HIDDEN * tokens * h + LAYER_ELEMENTS_PER_TOKEN_FFN * tokens * ffn / p.tp
                + LAYER_ELEMENTS_PER_SCORE * scores + LAYER_ELEMENTS_PER_PARAMETER * weights)
    if model.normalization == "RMSNorm":
        elements += 2 * RMSNORM_ELEMENTS_PER_TOKEN_HIDDEN * tokens * h
    if model.gated_mlp:
        elements += SWIGLU_ELEMENTS_PER_TOKEN_FFN * tokens * ffn / p.tp
    if not model.add_bias_linear:
        elements -= BIAS_ELEMENTS_PER_OUTPUT * tokens * (5 * h + ffn) / p.tp
    if model.position_embedding == "rope":
        rotated = (model.num_attention_heads + model.layer_kv_heads(layer_index)) * model.head_dim / p.tp
        elements += ROPE_ELEMENTS_PER_ROTATED_VALUE * tokens * rotated
    if model.is_gqa:
        elements += GQA_ELEMENTS_PER_TOKEN_HIDDEN * tokens * h / p.tp
    return elements


def _layer_weights(model: ModelSpec, layer_index: int, p: ParallelConfig) -> float:
    weights = layer_params(model, layer_index)
    return (weights.total - weights.routed_experts) / p.tp + weights.routed_experts / (p.ep * p.expert_tp)


def micro_batch_elements(model: ModelSpec, p: ParallelConfig, seq_length: int) -> float:
    """Elements a micro-batch's element-wise ops write outside the layers: embedding, output layer and loss."""
    tokens = p.mbs * seq_length / p.cp
    h = model.hidden_size
    vocab = model.padded_vocab_size(p.tp) / p.tp
    elements = MICRO_BATCH_ELEMENTS_PER_TOKEN_HIDDEN * tokens * h + MICRO_BATCH_ELEMENTS_PER_LOGIT * tokens * vocab \
        + MICRO_BATCH_ELEMENTS_PER_EMBEDDING_PARAMETER * vocab * h
    if model.normalization == "RMSNorm":
        elements += RMSNORM_ELEMENTS_PER_TOKEN_HIDDEN * tokens * h
    if model.position_embedding == "rope":
        elements += ROPE_MICRO_BATCH_ELEMENTS_PER_TOKEN_HIDDEN * tokens * h
    return elements


def step_elements(parameters: float) -> float:
    """Elements a step's element-wise ops write for the `parameters` a rank updates (its optimizer shard)."""
    return STEP_ELEMENTS_PER_PARAMETER * parameters


__all__ = ["layer_elements", "layer_ops", "micro_batch_elements", "micro_batch_ops", "parameter_tensors",
           "step_elements", "step_ops"]
