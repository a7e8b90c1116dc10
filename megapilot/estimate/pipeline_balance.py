"""The most balanced pipeline layout for a model, weighted by what each item costs.

`spec.pipeline.balanced_stages` cuts E, t…t, m…m, L into PP x VPP stages by weights in units of the mean
decoder layer. Where the layout is known (its TP, CP, EP, MBS), the weights are each item's time on it
(`step_time.stage_time_weights`: what the step is made of). Where it is not (a pipeline split listed before the
rest of the layout is chosen), they come from the FLOP model here (per token): an MoE layer and a dense-first
layer weigh what their GEMMs weigh, the loss is the logits GEMM (+ the cross-entropy, a memory pass of the
same width: counted as one more GEMM-width term), an MTP module is a layer, its eh-projection and its
own logits. The embedding is a lookup: no GEMM, weight 0.
"""

from __future__ import annotations

from functools import lru_cache

from megapilot.estimate.flops import GEMM_PASSES_FLOPS, layer_flops
from megapilot.spec.model import ModelSpec
from megapilot.spec.pipeline import PipelineSplit, StageWeights, balanced_stages


@lru_cache(maxsize=256)
def stage_weights(model: ModelSpec, seq_length: int) -> StageWeights:
    """Each layout item's FLOPs per token relative to the mean decoder layer."""
    layers = [layer_flops(model, i, seq_length) for i in range(model.num_layers)]
    unit = sum(layers) / len(layers)
    h = model.hidden_size
    logits = GEMM_PASSES_FLOPS * h * model.padded_vocab_size() * 4 / 3  # + cross-entropy, ~1/3 of the GEMM
    module = sum(layers[i] for i in model.mtp_layer_indices)  # the last layer's kind, or a hybrid's MTP pattern
    mtp = module + GEMM_PASSES_FLOPS * (3 * h + 2 * h * h) + logits if model.mtp_num_layers else 0.0
    return StageWeights(decoder=tuple(x / unit for x in layers), embedding=0.0, loss=logits / unit, mtp=mtp / unit)


def balanced_split(model: ModelSpec, pp: int, vpp: int, weights: StageWeights) -> PipelineSplit:
    """The concrete `--pipeline-model-parallel-layout` that `--pp-layout balanced` stands for, under `weights`
    (`stage_weights` by FLOPs, or `step_time.stage_time_weights` on a known layout)."""
    stages = balanced_stages(model.num_layers, model.mtp_num_layers, pp, vpp, weights)
    return PipelineSplit(layout=stages.layout_string())
