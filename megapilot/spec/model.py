"""ModelSpec: the architecture of a decoder-only transformer, in Megatron-Core's terms.

Field names follow Megatron-LM's arguments (`num_layers`, `hidden_size`, `ffn_hidden_size`,
`num_query_groups`, ...) so that a spec maps onto `pretrain_gpt.py` flags one to one.
Dense, GQA, SwiGLU, MoE (routed + shared experts, dense-first layers), DeepSeek MLA and MTP are
covered. Only validation lives here; counting and costing live in `megapilot.estimate`.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

# geglu = gated GELU (Gemma): a gated unit like swiglu (3 matrices), Megatron --gated-linear-unit with gelu.
# quick_geglu = GPT-OSS's gated unit (x * sigmoid(1.702 x), clamped, with a +1 linear offset): 3 matrices too.
MlpActivation = Literal["swiglu", "gelu", "squared_relu", "geglu", "quick_geglu"]
SoftmaxType = Literal["vanilla", "off-by-one", "learnable"]
Normalization = Literal["RMSNorm", "LayerNorm"]
PositionEmbedding = Literal["rope", "learned_absolute", "none"]
LoadBalancing = Literal["aux_loss", "seq_aux_loss", "sinkhorn", "none"]
RouterScoreFunction = Literal["softmax", "sigmoid", "sqrtsoftplus"]
RouterDtype = Literal["fp32", "fp64"]


# Upper bounds on a model's sizes, each far above the largest published model (named beside it), so no real model
# meets one while a slip (a few extra zeros, a byte count typed for a width) is refused by its field name instead
# of planned into a 10^50 GiB footprint.
MAX_LAYERS = 4_096  # Llama 3.1 405B: 126 layers; Nemotron-H 56B: 118
MAX_WIDTH = 262_144  # hidden size, MLA latent ranks: GPT-1T 25,600; Nemotron-4 340B 18,432
MAX_FFN = 1_048_576  # dense, expert and shared-expert MLP widths: Nemotron-4 340B 73,728
MAX_HEADS = 16_384  # attention, KV, Mamba and linear-attention heads: GPT-1T 160; Nemotron-H 56B Mamba 256
MAX_HEAD_DIM = 16_384  # channels per head: 256 (Gemma, Qwen3-Next), MLA's qk 128 + 64
MAX_VOCAB = 16_777_216  # Gemma 3: 262,144
MAX_EXPERTS = 65_536  # Qwen3-Next and Nemotron 3 Super: 512 routed experts
MAX_POSITIONS = 1_073_741_824  # Llama 4 Scout: 10,485,760


def _at_most(limit: int, largest: str) -> AfterValidator:
    def check(value: int | None) -> int | None:
        if value is not None and value > limit:
            raise ValueError(f"{value:,} is above {limit:,}, far beyond any published model ({largest}); "
                             "check the value for extra digits")
        return value

    return AfterValidator(check)


Layers = Annotated[int, _at_most(MAX_LAYERS, "Llama 3.1 405B has 126 layers")]
MtpDepth = Annotated[int, _at_most(MAX_LAYERS, "DeepSeek-V3 has 1 MTP layer, Nemotron 3 Super 2 depths")]
Width = Annotated[int, _at_most(MAX_WIDTH, "GPT-1T is 25,600 wide")]
FfnWidth = Annotated[int, _at_most(MAX_FFN, "Nemotron-4 340B's MLP is 73,728 wide")]
Heads = Annotated[int, _at_most(MAX_HEADS, "GPT-1T has 160 attention heads")]
HeadDim = Annotated[int, _at_most(MAX_HEAD_DIM, "the widest heads have 256 channels")]
Vocab = Annotated[int, _at_most(MAX_VOCAB, "Gemma 3's vocabulary is 262,144")]
Experts = Annotated[int, _at_most(MAX_EXPERTS, "Qwen3-Next has 512 experts")]
Positions = Annotated[int, _at_most(MAX_POSITIONS, "Llama 4 Scout's context is 10,485,760")]


class _Spec(BaseModel):
    # no infinite or NaN size, rate or coefficient: Megatron would write or divide by it (int(inf) raises)
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class MoESpec(_Spec):
    """Mixture-of-experts block (Megatron `--num-experts`, `--moe-*`)."""

    num_experts: Experts = Field(gt=1, description="Routed experts per MoE layer (--num-experts).")
    router_topk: int = Field(ge=1, description="Experts each token is routed to (--moe-router-topk).")
    moe_ffn_hidden_size: FfnWidth = Field(gt=0, description="FFN width of one routed expert (--moe-ffn-hidden-size).")
    shared_expert_ffn_hidden_size: FfnWidth = Field(
        default=0, ge=0,
        description="Total FFN width of the shared experts, 0 for none (--moe-shared-expert-intermediate-size).",
    )
    first_k_dense_layers: int = Field(
        default=0, ge=0, description="Leading layers that keep a dense MLP (DeepSeek `first_k_dense_replace`).",
    )
    moe_layer_freq: int = Field(
        default=1, ge=1, description="After the dense-first layers, every k-th layer is MoE (--moe-layer-freq).",
    )
    shared_expert_gate: bool = Field(
        default=False,
        description="Sigmoid gate h->1 on the shared experts' output (Qwen2-MoE, --moe-shared-expert-gate).",
    )
    router_expert_bias: bool = Field(
        default=False,
        description="Per-expert routing bias for aux-loss-free balancing (DeepSeek-V3 `e_score_correction_bias`, "
        "--moe-router-enable-expert-bias); Hugging Face checkpoints count it as E parameters per MoE layer.",
    )
    load_balancing_type: LoadBalancing = Field(
        default="aux_loss", description="Router load balancing (--moe-router-load-balancing-type).",
    )
    aux_loss_coeff: float = Field(default=1e-2, ge=0, description="Aux-loss coefficient (--moe-aux-loss-coeff).")
    router_score_function: RouterScoreFunction = Field(
        default="softmax",
        description="Router scores: softmax (Mixtral, Qwen, DeepSeek-V2), sigmoid (DeepSeek-V3 `scoring_func`) or "
        "sqrtsoftplus, the square root of softplus (DeepSeek-V4; core 0.18 on); --moe-router-score-function.",
    )
    router_pre_softmax: bool = Field(
        default=False,
        description="Softmax over all experts before the top-k, weights not renormalised over the chosen k "
        "(HF `norm_topk_prob: false`); False = top-k first, softmax over the k (renormalised). "
        "--moe-router-pre-softmax.",
    )
    router_topk_scaling_factor: float | None = Field(
        default=None, gt=0,
        description="Multiplier on the routing weights (HF `routed_scaling_factor`); "
        "--moe-router-topk-scaling-factor.",
    )
    router_num_groups: int | None = Field(
        default=None, gt=0,
        description="Group-limited routing: experts split into this many groups (HF `n_group`); "
        "--moe-router-num-groups.",
    )
    router_group_topk: int | None = Field(
        default=None, gt=0,
        description="Groups a token may pick its experts from (HF `topk_group`); --moe-router-group-topk.",
    )
    router_dtype: RouterDtype | None = Field(
        default=None,
        description="Precision of the router GEMM and scores; None = the model's dtype. DeepSeek computes its "
        "gate in fp32. --moe-router-dtype.",
    )
    capacity_factor: float | None = Field(
        default=None, gt=0,
        description="Token dropping: an expert takes at most this times its even share of the tokens "
        "(--moe-expert-capacity-factor); None = dropless (Megatron's default).",
    )
    pad_to_capacity: bool = Field(
        default=False,
        description="Pad every expert's input to its capacity (--moe-pad-expert-input-to-capacity): static shapes, "
        "no host sync in the dispatcher, padded rows computed and sent.",
    )
    latent_size: Width | None = Field(
        default=None, gt=0,
        description="Latent MoE (Nemotron 3 Super, HF `moe_latent_size`): tokens are projected h -> latent_size "
        "before dispatch and back after the combine; the routed experts run in that width, the router and the "
        "shared experts in h. None = experts in h. --moe-latent-size.",
    )
    num_hash_layers: int = Field(
        default=0, ge=0,
        description="The first MoE layers route each token by a fixed hash of its token id (a vocab x top-k table, "
        "a buffer, not a parameter) instead of the top-k of the router's scores, which still weight the chosen "
        "experts (DeepSeek-V4 `num_hash_layers`; Megatron-LM dev --moe-n-hash-layers, no core release). 0 = none.",
    )

    @model_validator(mode="after")
    def _topk_within_experts(self) -> MoESpec:
        if self.router_topk > self.num_experts:
            raise ValueError(
                f"router_topk={self.router_topk} exceeds num_experts={self.num_experts}; "
                "set router_topk <= num_experts"
            )
        if self.capacity_factor is not None and self.load_balancing_type == "sinkhorn":
            raise ValueError("capacity_factor (token dropping) works with aux_loss, seq_aux_loss or none load "
                             "balancing in Megatron-Core, not sinkhorn; choose one of those or drop capacity_factor")
        if self.pad_to_capacity and self.capacity_factor is None:
            raise ValueError("pad_to_capacity needs a capacity_factor (Megatron pads to the capacity it sets); set "
                             "capacity_factor, e.g. 1.0")
        return self

    @property
    def expert_load_factor(self) -> float:
        """Rows an expert computes and receives per even share of tokens: the capacity factor when inputs are
        padded to capacity, else 1 (dropless, or dropping only what exceeds capacity under even routing)."""
        return self.capacity_factor if self.pad_to_capacity and self.capacity_factor is not None else 1.0

    def routed_width(self, hidden_size: int) -> int:
        """Width of a dispatched token and of the routed experts' input and output: the latent size, else h."""
        return self.latent_size if self.latent_size is not None else hidden_size

    def tokens_per_expert(self, tokens: float, *, tp: int, ep: int, expert_tp: int) -> float:
        """Rows each local expert computes for `tokens` tokens of a TP rank's micro-batch: top-k copies spread
        evenly over the experts, gathered from the EP x ETP ranks of its group, padding to capacity included."""
        return tokens * self.expert_load_factor * self.router_topk * ep * expert_tp / (self.num_experts * tp)

    @model_validator(mode="after")
    def _router_rules(self) -> MoESpec:
        """The routing rules Megatron-Core's TransformerConfig enforces, checked where the spec is made."""
        if self.router_expert_bias and self.router_score_function == "softmax":
            raise ValueError(
                "router_expert_bias (aux-loss-free balancing) needs router_score_function 'sigmoid' or "
                "'sqrtsoftplus' in Megatron-Core; set router_score_function: sigmoid"
            )
        if self.router_pre_softmax and self.router_score_function != "softmax":
            raise ValueError(
                "router_pre_softmax applies to softmax routing only (sigmoid weights are always renormalised "
                "over the top-k); drop router_pre_softmax"
            )
        self._check_groups()
        return self

    def _check_groups(self) -> None:
        if (self.router_num_groups is None) != (self.router_group_topk is None):
            raise ValueError("group-limited routing needs both router_num_groups and router_group_topk")
        if self.router_num_groups is None or self.router_group_topk is None:
            return
        if self.num_experts % self.router_num_groups:
            raise ValueError(
                f"router_num_groups={self.router_num_groups} does not divide num_experts={self.num_experts}; "
                "choose a divisor of num_experts"
            )
        if self.router_group_topk > self.router_num_groups:
            raise ValueError(
                f"router_group_topk={self.router_group_topk} exceeds router_num_groups={self.router_num_groups}"
            )
        per_group_topk = self.router_topk // self.router_group_topk
        if per_group_topk < 1 or per_group_topk > self.num_experts // self.router_num_groups:
            raise ValueError(
                f"router_topk // router_group_topk = {per_group_topk} experts score each group, which needs "
                f"1 to {self.num_experts // self.router_num_groups} (the experts of one group); "
                "choose router_group_topk <= router_topk"
            )


class MambaSpec(_Spec):
    """Mamba-2 mixer of a hybrid model (pretrain_mamba.py: --mamba-state-dim, --mamba-head-dim, ...)."""

    state_dim: HeadDim = Field(default=128, gt=0,
                               description="SSM state size N (--mamba-state-dim; HF ssm_state_size).")
    head_dim: HeadDim = Field(default=64, gt=0, description="Channels per SSM head (--mamba-head-dim).")
    num_groups: Heads = Field(default=8, gt=0, description="B/C groups (--mamba-num-groups; HF n_groups).")
    num_heads: Heads | None = Field(
        default=None, gt=0, description="SSM heads (--mamba-num-heads); None = hidden_size * 2 / head_dim.",
    )
    conv_kernel: int = Field(default=4, gt=0, description="Depthwise causal conv width (Megatron's d_conv = 4).")

    def heads(self, hidden_size: int) -> int:
        return self.num_heads or hidden_size * 2 // self.head_dim

    def inner_size(self, hidden_size: int) -> int:
        """d_inner = heads x head_dim (the width the SSM scans)."""
        return self.heads(hidden_size) * self.head_dim


class GatedDeltaNetSpec(_Spec):
    """Gated DeltaNet linear attention in place of attention on most layers (Qwen3-Next; Megatron-Core 0.16
    `--experimental-attention-variant gated_delta_net`, megatron/core/ssm/gated_delta_net.py)."""

    key_heads: Heads = Field(default=16, gt=0, description="Query/key heads (--linear-num-key-heads).")
    value_heads: Heads = Field(default=32, gt=0, description="Value heads (--linear-num-value-heads).")
    key_head_dim: HeadDim = Field(default=128, gt=0, description="--linear-key-head-dim.")
    value_head_dim: HeadDim = Field(default=128, gt=0, description="--linear-value-head-dim.")
    conv_kernel: int = Field(default=4, gt=0, description="Depthwise causal conv width (--linear-conv-kernel-dim).")
    full_attention_freq: int = Field(
        default=4, ge=1,
        description="Every N-th layer (1-based) keeps full attention, the others are Gated DeltaNet "
        "(--linear-attention-freq; HF full_attention_interval).",
    )

    @model_validator(mode="after")
    def _check_heads(self) -> GatedDeltaNetSpec:
        if self.value_heads % self.key_heads:
            raise ValueError(
                f"value_heads={self.value_heads} is not a multiple of key_heads={self.key_heads} (Megatron-Core "
                "shares each key head over value_heads / key_heads value heads); choose a multiple"
            )
        return self

    @property
    def key_width(self) -> int:
        """All key heads together (the query has the same width)."""
        return self.key_heads * self.key_head_dim

    @property
    def value_width(self) -> int:
        return self.value_heads * self.value_head_dim

    @property
    def in_proj_width(self) -> int:
        """in_proj's outputs: q, k, v, the output gate z (as wide as v), and beta and alpha per value head."""
        return 2 * self.key_width + 2 * self.value_width + 2 * self.value_heads

    @property
    def conv_channels(self) -> int:
        """Channels the causal conv runs over: q, k and v."""
        return 2 * self.key_width + self.value_width


# One character per layer of a hybrid model, as --hybrid-override-pattern spells it.
HYBRID_MAMBA, HYBRID_ATTENTION, HYBRID_MLP, HYBRID_MOE = "M", "*", "-", "E"
LayerKind = Literal["transformer", "mamba", "attention", "mlp", "moe"]
_HYBRID_KINDS: dict[str, LayerKind] = {
    HYBRID_MAMBA: "mamba", HYBRID_ATTENTION: "attention", HYBRID_MLP: "mlp", HYBRID_MOE: "moe",
}


BlockPart = Literal["full", "linear", "none"]


class LayerBlock(_Spec):
    """One layer's own attention and MLP, for models whose layers differ (Llama-Nemotron's `block_configs`;
    Megatron-Core's heterogeneous layers, --heterogeneous-layers-config-path). `linear` replaces the sublayer by
    one h -> h linear (with its norm), `none` removes it (and its norm)."""

    attention: BlockPart = Field(default="full", description="full attention, a linear h -> h, or none.")
    kv_heads: Heads | None = Field(default=None, gt=0, description="This layer's KV heads; None = the model's.")
    mlp: BlockPart = Field(default="full", description="full MLP, a linear h -> h, or none.")
    ffn_hidden_size: FfnWidth | None = Field(default=None, gt=0,
                                             description="This layer's MLP width; None = the model's.")

    @property
    def sublayers(self) -> int:
        """Sublayers the layer keeps (each with its norm, residual and TP collectives): 2 for a full layer."""
        return (self.attention != "none") + (self.mlp != "none")


class DSASpec(_Spec):
    """DeepSeek Sparse Attention (DeepSeek-V3.2; Megatron `--experimental-attention-variant dsa`, MLA only): a
    lightning indexer scores every earlier token with a few small heads (ReLU(q.k) weighted per head) and each
    query attends, through MLA, to the `topk` best only. The indexer's q comes from MLA's q latent, its single
    key and per-head weights from the layer input; it learns from a KL loss against the attention it imitates."""

    indexer_heads: Heads = Field(gt=0, description="Indexer heads (--dsa-indexer-n-heads, HF index_n_heads).")
    indexer_head_dim: HeadDim = Field(gt=0, description="Indexer head dim (--dsa-indexer-head-dim, HF index_head_dim).")
    topk: Positions = Field(gt=0, description="Tokens each query attends to (--dsa-indexer-topk, HF index_topk).")
    topk_freq: int = Field(
        default=1, gt=0,
        description="Cross-layer top-k sharing (GLM-5; --dsa-indexer-topk-freq, core_v0.19.0 on): 1-based layer L "
        "runs its own indexer when max(L - max(skip_topk_offset, 1), 0) is a multiple of this; the others reuse that "
        "layer's top-k and hold no indexer.")
    skip_topk_offset: int = Field(default=0, ge=0, description="--dsa-indexer-skip-topk-offset (see topk_freq).")
    rope_interleaved: bool = Field(
        default=False, description="The indexer's RoPE in interleaved pairs (GLM-5; --dsa-indexer-rope-interleaved, "
        "core_v0.19.0 on); DeepSeek-V3.2 rotates half-split.")
    rotate_activation: bool = Field(
        default=True, description="A Hadamard rotation of the indexer's q and k before scoring (DeepSeek-V3.2); "
        "GLM-5 scores without it (--no-dsa-indexer-rotate-activation, core_v0.19.0 on).")

    def runs_indexer(self, layer_index: int) -> bool:
        """Whether 0-based layer `layer_index` runs its own indexer."""
        return runs_own_indexer(layer_index, self.topk_freq, self.skip_topk_offset)


def runs_own_indexer(layer_index: int, topk_freq: int, skip_topk_offset: int) -> bool:
    """Megatron-Core's is_dsa_skip_topk_layer, negated: 0-based layer `layer_index` runs a DSA indexer of its own
    under top-k sharing every `topk_freq` layers after `skip_topk_offset`."""
    return max(layer_index + 1 - max(skip_topk_offset, 1), 0) % topk_freq == 0


# DeepSeek-V4's per-layer attention kinds, by compress ratio (Megatron-LM dev's hybrid-pattern symbols W, C, H).
WINDOW_ONLY, COMPRESSED_SPARSE, HEAVILY_COMPRESSED = 0, 4, 128
CompressRatio = Literal[0, 4, 128]


class CompressedAttentionSpec(_Spec):
    """DeepSeek-V4's hybrid attention over MLA's q LoRA (Megatron-LM dev `--experimental-attention-variant
    dsv4_hybrid`, megatron/core/transformer/experimental_attention_variant/csa.py; no core release has it). Every
    layer attends to the model's `sliding_window` last tokens through one shared K=V head of `v_head_dim` (MLA's
    `kv_lora_rank`, projected straight from h: no up-projection), with a learned sink logit per head
    (`softmax_type` learnable). A layer of compress ratio 4 (CSA) also pools every 4 tokens, in overlapping
    windows, into one compressed key and attends to the `mla.dsa.topk` of them its indexer (over its own compressed
    keys of `indexer_head_dim`) picks; a layer of ratio 128 (HCA) pools every 128 tokens and attends to all of
    them; ratio 0 is the window alone. A pool is a gated softmax over two h -> (1 or 2) x head_dim projections
    (wkv, wgate), a learned per-position bias and an RMSNorm. The heads' output goes through `o_groups` grouped
    projections to `o_lora_rank` each, then one o_groups x o_lora_rank -> h projection."""

    compress_ratios: tuple[CompressRatio, ...] = Field(
        description="One compress ratio per layer, the main model's then each MTP layer's (HF `compress_ratios`; "
        "Megatron-LM dev --csa-compress-ratios): 0 window only, 4 compressed sparse, 128 heavily compressed.",
    )
    o_groups: Heads = Field(gt=0, description="Groups of heads of the grouped output projection (HF/--o-groups).")
    o_lora_rank: Width = Field(gt=0, description="Each group's low rank before the last output projection "
                                               "(HF/--o-lora-rank).")

    def ratio(self, layer_index: int) -> int:
        """Layer `layer_index`'s compress ratio (0-based; the MTP layers follow the main model's)."""
        return self.compress_ratios[layer_index]

    @staticmethod
    def compressor_overlaps(ratio: int) -> bool:
        """A ratio-4 pool spans two windows (its projections twice as wide), Megatron's `coff = 2`."""
        return ratio == COMPRESSED_SPARSE


class MLASpec(_Spec):
    """DeepSeek multi-head latent attention (Megatron `--multi-latent-attention`)."""

    q_lora_rank: Width | None = Field(default=None, gt=0,
                                    description="Query LoRA rank; None = full-rank query (V2-Lite).")
    kv_lora_rank: Width = Field(gt=0, description="Compressed KV rank (--kv-lora-rank).")
    qk_head_dim: HeadDim = Field(gt=0,
                                 description="Non-rotary query/key head dim (--qk-head-dim, HF qk_nope_head_dim).")
    qk_pos_emb_head_dim: HeadDim = Field(gt=0, description="Rotary query/key head dim (--qk-pos-emb-head-dim).")
    v_head_dim: HeadDim = Field(gt=0, description="Value head dim (--v-head-dim).")
    latent_layernorms: bool = Field(
        default=True,
        description="RMSNorm on the compressed q and kv latents (DeepSeek's q_a_layernorm/kv_a_layernorm); "
        "Megatron builds them with --qk-layernorm under MLA.",
    )
    dsa: DSASpec | None = Field(
        default=None, description="DeepSeek Sparse Attention over the MLA heads (DeepSeek-V3.2); None = dense MLA. "
        "Under `csa`, the indexer of the compress-ratio-4 layers, over their compressed keys (DeepSeek-V4).")
    csa: CompressedAttentionSpec | None = Field(
        default=None, description="DeepSeek-V4's window + compressed-KV attention on every layer; None = MLA.")

    @model_validator(mode="after")
    def _check_compressed_attention(self) -> MLASpec:
        if self.csa is None:
            return self
        if self.q_lora_rank is None:
            raise ValueError("csa (DeepSeek-V4 attention) projects q through a LoRA; set mla.q_lora_rank")
        if self.qk_head_dim + self.qk_pos_emb_head_dim != self.v_head_dim or self.kv_lora_rank != self.v_head_dim:
            raise ValueError(
                f"csa attends through one K=V head: qk_head_dim + qk_pos_emb_head_dim ({self.qk_head_dim} + "
                f"{self.qk_pos_emb_head_dim}) and kv_lora_rank ({self.kv_lora_rank}) must equal v_head_dim "
                f"({self.v_head_dim}); set them so")
        if COMPRESSED_SPARSE in self.csa.compress_ratios and self.dsa is None:
            raise ValueError("csa has compress-ratio-4 layers, whose indexer picks their compressed keys; set mla.dsa "
                             "(indexer_heads, indexer_head_dim, topk)")
        if self.dsa is not None and (self.dsa.topk_freq != 1 or self.dsa.skip_topk_offset):
            raise ValueError("csa runs an indexer on every compress-ratio-4 layer; drop dsa.topk_freq and "
                             "dsa.skip_topk_offset")
        return self


class Llama3RopeScaling(_Spec):
    """Llama 3.x frequency-dependent RoPE scaling (HF `rope_scaling.rope_type: llama3`; --use-rope-scaling)."""

    type: Literal["llama3"] = "llama3"
    factor: float = Field(gt=0, description="Wavelength stretch of the low frequencies (--rope-scaling-factor).")
    low_freq_factor: float = Field(default=1.0, gt=0)
    high_freq_factor: float = Field(default=4.0, gt=0)
    original_max_position_embeddings: Positions = Field(
        default=8192, gt=0, description="Context length the unscaled model was trained at.",
    )


class YarnRopeScaling(_Spec):
    """YaRN RoPE scaling (HF `rope_scaling.type: yarn`; Megatron --rope-type yarn under MLA)."""

    type: Literal["yarn"] = "yarn"
    factor: float = Field(gt=0, description="Context extension factor (--rotary-scaling-factor).")
    original_max_position_embeddings: Positions = Field(gt=0, description="Context length before the extension.")
    beta_fast: float = Field(default=32.0, gt=0)
    beta_slow: float = Field(default=1.0, gt=0)
    mscale: float = Field(default=1.0, description="Attention temperature term (--mscale).")
    mscale_all_dim: float = Field(default=0.0, description="Softmax-scale term over all dims (--mscale-all-dim).")
    truncate: bool = Field(
        default=True,
        description="Round the correction range to whole dimensions (HF `truncate`; Megatron-Core's "
                    "yarn_correction_range_round_to_int). GPT-OSS: false.",
    )

    @property
    def concentration(self) -> float:
        """The factor Megatron multiplies RoPE's cos and sin by (`_yarn_get_concentration_factor`,
        models/common/embeddings/yarn_rotary_pos_embedding.py): mscale's term over mscale_all_dim's."""
        def term(m: float) -> float:
            return 1.0 if self.factor <= 1 else 0.1 * m * math.log(self.factor) + 1.0
        return term(self.mscale) / term(self.mscale_all_dim)


class LinearRopeScaling(_Spec):
    """Position interpolation: positions divided by `factor` (HF `rope_scaling.type: linear`)."""

    type: Literal["linear"] = "linear"
    factor: float = Field(gt=0, description="Positions are divided by this.")


RopeScaling = Annotated[Llama3RopeScaling | YarnRopeScaling | LinearRopeScaling, Field(discriminator="type")]


class ModelSpec(_Spec):
    """A decoder-only transformer in Megatron-Core's vocabulary."""

    name: str = Field(description="Preset name or the model's own name.")
    num_layers: Layers = Field(gt=0, description="Transformer layers (--num-layers).")
    hidden_size: Width = Field(gt=0, description="Model width (--hidden-size).")
    ffn_hidden_size: FfnWidth = Field(gt=0, description="Dense MLP width (--ffn-hidden-size).")
    num_attention_heads: Heads = Field(gt=0, description="Query heads (--num-attention-heads).")
    num_query_groups: Heads | None = Field(
        default=None, gt=0, description="KV heads for GQA (--num-query-groups); None = MHA.",
    )
    kv_channels: HeadDim | None = Field(
        default=None, gt=0, description="Head dim (--kv-channels); None = hidden_size / num_attention_heads.",
    )
    vocab_size: Vocab = Field(gt=0, description="Tokenizer vocabulary before padding.")
    make_vocab_size_divisible_by: int = Field(
        default=128, gt=0, description="Megatron pads the vocab to a multiple of this times TP.",
    )
    max_position_embeddings: Positions = Field(default=4096, gt=0, description="--max-position-embeddings.")
    mlp_activation: MlpActivation = Field(default="swiglu", description="swiglu adds a third (gate) GEMM.")
    normalization: Normalization = "RMSNorm"
    norm_epsilon: float = Field(default=1e-5, gt=0)
    position_embedding: PositionEmbedding = "rope"
    rotary_base: int = Field(default=10000, gt=0, description="--rotary-base.")
    rotary_percent: float = Field(
        default=1.0, gt=0, le=1,
        description="Share of each head's channels RoPE rotates (--rotary-percent; HF partial_rotary_factor).",
    )
    norm_zero_centered: bool = Field(
        default=False, description="Norm scales stored as 1 + weight (--apply-layernorm-1p; Qwen3-Next's RMSNorm).",
    )
    rope_scaling: RopeScaling | None = Field(
        default=None, description="RoPE frequency scaling for long context (HF `rope_scaling`); None = plain RoPE.",
    )
    sliding_window: Positions | None = Field(
        default=None, gt=0,
        description="Every layer attends to the last `sliding_window` tokens only (Mistral); None = full causal "
        "attention. --window-size W-1,0.",
    )
    sliding_window_skip_freq: int | None = Field(
        default=None, ge=2,
        description="With sliding_window: every N-th layer (1-based) keeps full attention, the others slide "
        "(--window-attn-skip-freq; GPT-OSS alternates, N=2). None = every layer slides.",
    )
    glu_linear_offset: float = Field(
        default=0.0, description="Added to the gated unit's linear half (GPT-OSS: 1.0; --glu-linear-offset).",
    )
    activation_clamp: float | None = Field(
        default=None, gt=0,
        description="Clamp of the gated unit's inputs (GPT-OSS swiglu_limit 7.0; --activation-func-clamp-value).",
    )
    softmax_type: SoftmaxType = Field(
        default="vanilla",
        description="Attention softmax (--softmax-type): 'learnable' adds one learned sink logit per head "
        "(GPT-OSS attention sinks), 'off-by-one' a fixed one.",
    )
    attention_chunk_size: Positions | None = Field(
        default=None, gt=0,
        description="Chunked local attention on the RoPE layers (Llama 4, 8192): no core_v0.16.0 flag; costed only.",
    )
    no_rope_freq: int | None = Field(
        default=None, ge=2, description="Every N-th layer has no RoPE and full attention (Llama 4: --no-rope-freq 4).",
    )
    tie_embeddings: bool = Field(default=False, description="Output layer shares the input embedding.")
    add_bias_linear: bool = Field(default=False, description="Biases on linear layers (GPT-2 style).")
    add_qkv_bias: bool = Field(default=False, description="Bias on QKV only (Qwen2 style).")
    qk_layernorm: bool = Field(default=False, description="Norm on per-head q and k (Qwen3 style).")
    qk_l2_norm: bool = Field(
        default=False,
        description="Weightless L2 norm (x / rms(x)) on per-head q and k of every layer that applies RoPE, the "
        "NoPE layers of no_rope_freq left out (Llama 4 `use_qk_norm`, as transformers and Megatron-Bridge's Llama 4 "
        "layer spec build it); --qk-l2-norm, which Megatron-LM applies to every layer.",
    )
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    mamba: MambaSpec | None = Field(default=None, description="The Mamba-2 mixer of a hybrid model.")
    gated_delta_net: GatedDeltaNetSpec | None = Field(
        default=None, description="Gated DeltaNet linear attention on all layers but every full_attention_freq-th.",
    )
    layer_blocks: tuple[LayerBlock, ...] | None = Field(
        default=None,
        description="Per-layer attention and MLP shapes when layers differ (Llama-3.3-Nemotron-Super-49B; "
        "--heterogeneous-layers-config-path); None = every layer is the model's.",
    )
    attention_output_gate: bool = Field(
        default=False,
        description="A sigmoid gate on the attention output, projected by QKV (Qwen3-Next; --attention-output-gate).",
    )
    hybrid_override_pattern: str | None = Field(
        default=None,
        description="Hybrid layer mix, one character per layer: M Mamba-2, * attention, - MLP, E MoE "
        "(--hybrid-override-pattern; such models train with pretrain_mamba.py).",
    )
    mtp_num_layers: MtpDepth = Field(default=0, ge=0, description="Multi-token-prediction depth (--mtp-num-layers).")
    mtp_loss_scaling_factor: float = Field(
        default=0.1, ge=0,
        description="Weight of the MTP loss beside the LM loss (--mtp-loss-scaling-factor; Megatron's default 0.1).",
    )
    mtp_hybrid_pattern: str | None = Field(
        default=None,
        description="The layers of each MTP module of a hybrid model, in hybrid_override_pattern symbols (HF "
        "`mtp_hybrid_override_pattern`, --mtp-hybrid-override-pattern; Nemotron 3 Super: '*E', attention then MoE). "
        "None = one layer like the model's last.",
    )
    mtp_repeated_layer: bool = Field(
        default=False,
        description="Every MTP depth reuses one module's weights (--mtp-use-repeated-layer): the compute grows with "
        "mtp_num_layers, the weights do not.",
    )
    residual_streams: int = Field(
        default=1, ge=1, le=16,
        description="Hyper-connection residual streams (DeepSeek-V4 `hc_mult` 4; Megatron-LM main after core 0.19: "
        "--enable-hyper-connections, --num-residual-streams): each sublayer reads a learned mix of the streams and "
        "writes back into all of them, the mixes computed per token from the streams by a small fp32 projection. "
        "1 = the plain residual.",
    )
    hf_architecture: str | None = Field(default=None, description="Source architecture when imported from HF.")

    @model_validator(mode="after")
    def _check_shapes(self) -> ModelSpec:
        if self.num_query_groups is not None and self.num_attention_heads % self.num_query_groups:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not divisible by "
                f"num_query_groups={self.num_query_groups}; use a KV-head count that divides the head count"
            )
        if self.kv_channels is None and self.mla is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} is not divisible by num_attention_heads="
                f"{self.num_attention_heads}; set kv_channels explicitly"
            )
        if self.moe is not None and self.moe.first_k_dense_layers > self.num_layers:
            raise ValueError("moe.first_k_dense_layers exceeds num_layers")
        return self

    @model_validator(mode="after")
    def _check_attention_options(self) -> ModelSpec:
        if self.mla is not None and self.qk_layernorm:
            raise ValueError(
                "qk_layernorm (per-head q/k norms) is not an option of MLA; its q/kv latent norms are "
                "mla.latent_layernorms"
            )
        if self.qk_l2_norm and (self.mla is not None or self.qk_layernorm):
            # Megatron-Core asserts it off under MLA, and its layer specs build the L2 norm in place of a
            # weighted q/k norm, never both
            raise ValueError("qk_l2_norm (a weightless L2 norm on per-head q and k) is not an option of MLA and "
                             "replaces qk_layernorm; drop one of them")
        if self.hybrid_override_pattern is not None:
            self._check_hybrid(self.hybrid_override_pattern)
        self._check_mtp_pattern()
        self._check_layer_blocks()
        if self.sliding_window_skip_freq is not None and self.sliding_window is None:
            raise ValueError("sliding_window_skip_freq needs sliding_window; set the window or drop the frequency")
        if self.gated_delta_net is not None and (self.mla is not None or self.hybrid_override_pattern is not None):
            raise ValueError("gated_delta_net replaces standard attention on a transformer stack; it does not combine "
                             "with mla or a hybrid_override_pattern")
        self._check_compressed_attention()
        self._check_hash_layers()
        if self.rope_scaling is not None and self.position_embedding != "rope":
            raise ValueError(
                f"rope_scaling needs position_embedding='rope' (got {self.position_embedding!r}); drop rope_scaling"
            )
        return self

    def _check_compressed_attention(self) -> None:
        csa = self.csa
        if csa is None:
            return
        if self.sliding_window is None or self.sliding_window_skip_freq is not None:
            raise ValueError("csa (DeepSeek-V4 attention) attends over a window on every layer; set sliding_window "
                             "(128) and drop sliding_window_skip_freq")
        if self.softmax_type != "learnable":
            raise ValueError("csa attends with a learned sink logit per head; set softmax_type: learnable")
        if self.num_attention_heads % csa.o_groups:
            raise ValueError(f"mla.csa.o_groups={csa.o_groups} does not divide num_attention_heads="
                             f"{self.num_attention_heads} (each group projects its own heads); choose a divisor")
        layers = self.num_layers + self.mtp_num_layers
        if len(csa.compress_ratios) != layers:
            raise ValueError(f"mla.csa.compress_ratios has {len(csa.compress_ratios)} ratios but the model has "
                             f"{layers} attention layers (num_layers + mtp_num_layers); give one per layer")
        if self.mtp_num_layers and csa.ratio(self.num_layers) not in csa.compress_ratios[:self.num_layers]:
            raise ValueError("mla.csa.compress_ratios gives the MTP layer a ratio no main-model layer has; an MTP "
                             "layer is costed as a main-model layer of its kind")

    def _check_hash_layers(self) -> None:
        hashed = self.moe.num_hash_layers if self.moe is not None else 0
        if hashed and not all(self.is_moe_layer(i) for i in range(min(hashed, self.num_layers))):
            raise ValueError(f"moe.num_hash_layers={hashed} routes the first {hashed} layers by hash, so they must "
                             "be MoE layers; set first_k_dense_layers to 0 or num_hash_layers to 0")
        if hashed > self.num_layers:
            raise ValueError(f"moe.num_hash_layers={hashed} exceeds num_layers={self.num_layers}")

    def _check_hybrid(self, pattern: str) -> None:
        unknown = sorted(set(pattern) - set(_HYBRID_KINDS))
        if unknown:
            raise ValueError(f"hybrid_override_pattern has {unknown}; use only M (Mamba), * (attention), - (MLP), "
                             "E (MoE)")
        if len(pattern) != self.num_layers:
            raise ValueError(f"hybrid_override_pattern has {len(pattern)} layers but num_layers={self.num_layers}; "
                             "write one character per layer")
        if HYBRID_MAMBA in pattern and self.mamba is None:
            raise ValueError("hybrid_override_pattern has Mamba layers (M) but no mamba settings; set mamba")
        if HYBRID_MOE in pattern and self.moe is None:
            raise ValueError("hybrid_override_pattern has MoE layers (E) but no moe settings; set moe")

    def _check_layer_blocks(self) -> None:
        blocks = self.layer_blocks
        if blocks is None:
            return
        if len(blocks) != self.num_layers:
            raise ValueError(f"layer_blocks has {len(blocks)} blocks but num_layers={self.num_layers}; give one per "
                             "layer")
        others = [name for name, value in (("moe", self.moe), ("mla", self.mla), ("gated_delta_net",
                  self.gated_delta_net), ("hybrid_override_pattern", self.hybrid_override_pattern)) if value]
        if others:
            raise ValueError(f"layer_blocks (heterogeneous dense layers) do not combine with {', '.join(others)} in "
                             "Megatron-Core; drop one of them")
        for index, block in enumerate(blocks):
            kv_heads = block.kv_heads or self.kv_heads
            if self.num_attention_heads % kv_heads:
                raise ValueError(f"layer_blocks[{index}].kv_heads={kv_heads} does not divide "
                                 f"num_attention_heads={self.num_attention_heads}")

    def _check_mtp_pattern(self) -> None:
        pattern = self.mtp_hybrid_pattern
        if pattern is None:
            return
        if self.hybrid_override_pattern is None:
            raise ValueError("mtp_hybrid_pattern describes a hybrid model's MTP module; this model has no "
                             "hybrid_override_pattern, so drop mtp_hybrid_pattern")
        missing = sorted(set(pattern) - set(self.hybrid_override_pattern))
        if not pattern or missing:
            raise ValueError(f"mtp_hybrid_pattern={pattern!r} needs layer kinds the main model has (missing: "
                             f"{missing or 'every layer'}); write it in the symbols of hybrid_override_pattern")

    def __hash__(self) -> int:
        """A few defining fields only: equal specs still hash equal, and the estimator's caches, keyed by the
        spec thousands of times per plan, skip pydantic's walk over every nested field."""
        return hash((self.name, self.num_layers, self.hidden_size, self.ffn_hidden_size))

    # ---- derived values -------------------------------------------------------------------
    @property
    def is_hybrid(self) -> bool:
        """A Mamba hybrid (pretrain_mamba.py), whose layers each hold one block: mixer, attention, MLP or MoE."""
        return self.hybrid_override_pattern is not None

    def layer_block(self, layer_index: int) -> LayerBlock:
        """Layer `layer_index`'s attention and MLP shape: its own block, or the model's."""
        return self.layer_blocks[layer_index] if self.layer_blocks is not None else _UNIFORM_BLOCK

    @property
    def shardable_kv_heads(self) -> int:
        """The KV-head count TP must divide: the model's, or the GCD of its heterogeneous layers' (each layer's
        KV groups are split whole)."""
        if self.layer_blocks is None:
            return self.kv_heads
        return math.gcd(*(self.layer_kv_heads(i) for i in range(self.num_layers)
                          if self.layer_blocks[i].attention == "full"), self.kv_heads)

    def layer_kv_heads(self, layer_index: int) -> int:
        return self.layer_block(layer_index).kv_heads or self.kv_heads

    def layer_ffn_hidden_size(self, layer_index: int) -> int:
        return self.layer_block(layer_index).ffn_hidden_size or self.ffn_hidden_size

    @property
    def mtp_layer_indices(self) -> tuple[int, ...]:
        """The layers of one MTP module, each named by a main-model layer of the same kind (it has the same
        weights, work and activations): the model's last layer, or a hybrid's `mtp_hybrid_pattern`."""
        if self.csa is not None and self.mtp_num_layers:  # the first main-model layer of the MTP layer's ratio
            return (self.csa.compress_ratios.index(self.csa.ratio(self.num_layers)),)
        if self.mtp_hybrid_pattern is None or self.hybrid_override_pattern is None:
            return (self.num_layers - 1,)
        return tuple(self.hybrid_override_pattern.index(symbol) for symbol in self.mtp_hybrid_pattern)

    @property
    def mtp_weight_copies(self) -> int:
        """MTP modules whose weights exist: one when every depth repeats it, else one per depth."""
        return min(1, self.mtp_num_layers) if self.mtp_repeated_layer else self.mtp_num_layers

    def layer_kind(self, layer_index: int) -> LayerKind:
        """What layer `layer_index` holds: a transformer layer (attention + MLP/MoE), or one hybrid block."""
        if self.hybrid_override_pattern is None:
            return "transformer"
        return _HYBRID_KINDS[self.hybrid_override_pattern[layer_index]]

    def is_linear_attention_layer(self, layer_index: int) -> bool:
        """Whether 0-based `layer_index` mixes tokens with Gated DeltaNet instead of attention (Megatron's
        pattern: every full_attention_freq-th layer, 1-based, keeps attention)."""
        gdn = self.gated_delta_net
        return gdn is not None and (layer_index + 1) % gdn.full_attention_freq != 0

    def has_attention(self, layer_index: int) -> bool:
        """Layer `layer_index` runs an attention (a heterogeneous layer's may be a linear or nothing)."""
        return self.layer_kind(layer_index) in ("transformer", "attention") \
            and self.layer_block(layer_index).attention == "full"

    def has_softmax_core(self, layer_index: int) -> bool:
        """Layer `layer_index` runs a softmax attention core (Transformer Engine's DotProductAttention): an
        attention that is not Gated DeltaNet's linear one."""
        return self.has_attention(layer_index) and not self.is_linear_attention_layer(layer_index)

    @property
    def has_softmax_attention(self) -> bool:
        """Whether any layer runs a softmax attention core (the layers a CP comm type applies to): not a pure Mamba
        or linear-attention stack."""
        return any(self.has_softmax_core(i) for i in range(self.num_layers))

    @property
    def dsa(self) -> DSASpec | None:
        """DeepSeek Sparse Attention's indexer settings, when the MLA layers attend sparsely."""
        return self.mla.dsa if self.mla is not None else None

    @property
    def csa(self) -> CompressedAttentionSpec | None:
        """DeepSeek-V4's compressed attention settings, when the MLA layers attend that way."""
        return self.mla.csa if self.mla is not None else None

    @property
    def dsa_indexer_projections(self) -> tuple[tuple[int, int], ...]:
        """(in, out) of the DSA indexer's projections, none without DSA: MLA's q latent (the input without a q
        LoRA) -> heads x head_dim, and the layer input -> its one key (head_dim) and per-head weights (heads).
        DeepSeek-V4's indexer takes its keys from a compressor of its own instead: the layer input -> wkv and wgate
        of 2 x head_dim each (ratio 4 overlaps), beside the per-head weights."""
        dsa, mla = self.dsa, self.mla
        if dsa is None or mla is None:
            return ()
        query = (mla.q_lora_rank or self.hidden_size, dsa.indexer_heads * dsa.indexer_head_dim)
        if mla.csa is not None:
            return (query, (self.hidden_size, dsa.indexer_heads),
                    *self._compressor_projections(COMPRESSED_SPARSE, dsa.indexer_head_dim))
        return (query, (self.hidden_size, dsa.indexer_head_dim + dsa.indexer_heads))

    def compressor_projections(self, layer_index: int) -> tuple[tuple[int, int], ...]:
        """(in, out) of DeepSeek-V4's KV compressor on layer `layer_index` (none on a window-only layer or
        without csa): wkv and wgate, h -> (2 if the ratio overlaps else 1) x v_head_dim each."""
        mla = self.mla
        if mla is None or mla.csa is None:
            return ()
        return self._compressor_projections(mla.csa.ratio(layer_index), mla.v_head_dim)

    def hyper_connection_projections(self) -> tuple[tuple[int, int], ...]:
        """(in, out) of one layer's hyper-connection mixing projections, none without hyper-connections: one per
        sublayer (attention, MLP), the n streams (n x h) -> the n^2 + 2n mixing logits (H_res, H_pre, H_post)."""
        n = self.residual_streams
        if n == 1:
            return ()
        projection = (n * self.hidden_size, n * n + 2 * n)
        return (projection, projection)

    def _compressor_projections(self, ratio: int, head_dim: int) -> tuple[tuple[int, int], ...]:
        if ratio == WINDOW_ONLY:
            return ()
        width = (2 if CompressedAttentionSpec.compressor_overlaps(ratio) else 1) * head_dim
        return ((self.hidden_size, width), (self.hidden_size, width))

    def runs_dsa_indexer(self, layer_index: int) -> bool:
        """Whether 0-based layer `layer_index` runs a DeepSeek Sparse Attention indexer of its own (DeepSeek-V4:
        its compress-ratio-4 layers)."""
        dsa, csa = self.dsa, self.csa
        if dsa is not None and csa is not None:
            return csa.ratio(layer_index) == COMPRESSED_SPARSE
        return dsa is not None and dsa.runs_indexer(layer_index)

    @property
    def head_dim(self) -> int:
        """Per-head dim of standard attention (kv_channels)."""
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def kv_heads(self) -> int:
        """KV heads: num_query_groups under GQA, else one per query head."""
        return self.num_query_groups or self.num_attention_heads

    @property
    def is_gqa(self) -> bool:
        return self.num_query_groups is not None and self.num_query_groups < self.num_attention_heads

    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    @property
    def gated_mlp(self) -> bool:
        """SwiGLU and GeGLU have gate and up projections (3 GEMMs); GELU and squared ReLU have 2."""
        return self.mlp_activation in ("swiglu", "geglu", "quick_geglu")

    def is_nope_layer(self, layer_index: int) -> bool:
        """Whether 0-based `layer_index` is one of no_rope_freq's layers without RoPE (Llama 4)."""
        return self.no_rope_freq is not None and (layer_index + 1) % self.no_rope_freq == 0

    def qk_l2_norm_at(self, layer_index: int) -> bool:
        """Whether 0-based `layer_index` L2-normalises its q and k: qk_l2_norm on the layers with RoPE."""
        return self.qk_l2_norm and not self.is_nope_layer(layer_index)

    def attention_window(self, layer_index: int) -> int | None:
        """Tokens layer `layer_index` (0-based) attends back over: the sliding window, a Llama 4 chunk, or
        None (all)."""
        if self.is_nope_layer(layer_index):
            return None  # Llama 4's NoPE layers attend globally
        if self.attention_chunk_size is not None:
            return self.attention_chunk_size
        if self.sliding_window is None:
            return None
        if self.sliding_window_skip_freq is not None and (layer_index + 1) % self.sliding_window_skip_freq == 0:
            return None
        return self.sliding_window

    def is_moe_layer(self, layer_index: int) -> bool:
        """Whether 0-based `layer_index` holds an MoE block (Megatron's dense-first + frequency pattern)."""
        if self.hybrid_override_pattern is not None:
            return self.hybrid_override_pattern[layer_index] == HYBRID_MOE
        if self.moe is None or layer_index < self.moe.first_k_dense_layers:
            return False
        return (layer_index - self.moe.first_k_dense_layers) % self.moe.moe_layer_freq == 0

    @property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    def padded_vocab_size(self, tp: int = 1) -> int:
        """Vocab after Megatron's padding to a multiple of make_vocab_size_divisible_by * TP."""
        multiple = self.make_vocab_size_divisible_by * tp
        return -(-self.vocab_size // multiple) * multiple


_UNIFORM_BLOCK = LayerBlock()
