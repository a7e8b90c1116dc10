"""The kernels of one Mamba-2 mixer's training step, each priced on its own roofline.

What Megatron-Core runs between a Mamba layer's in_proj and out_proj (`MambaMixer._ssm_training`,
megatron/core/ssm/mamba_mixer.py; the memory-efficient path, on by default, `use_mamba_mem_eff_path`):

- `mamba_split_conv1d_scan_combined` (state-spaces/mamba, mamba_ssm/ops/triton/ssd_combined.py,
  `MambaSplitConv1dScanCombinedFn`), called without the norm and out_proj it could fuse, with z:
  forward, the causal depthwise conv1d over x, B, C with its SiLU (Dao-AILab/causal-conv1d,
  `causal_conv1d_fwd_function`) and `_mamba_chunk_scan_combined_fwd`: `_chunk_cumsum_fwd`, `_chunk_state_fwd`
  (ssd_chunk_state.py, states in fp32), `_state_passing_fwd` (ssd_state_passing.py, passed states in the input
  dtype), `_bmm_chunk_fwd` (ssd_bmm.py, C B^T per chunk in fp32) and `_chunk_scan_fwd` (ssd_chunk_scan.py, the
  output gated by SiLU(z) and the ungated output it saves). It saves only its input zxBCdt and that ungated
  output. Backward, `MambaSplitConv1dScanCombinedFn.backward` recomputes the conv, and
  `_mamba_chunk_scan_combined_bwd` recomputes the cumsum, C B^T, the chunk states (fp32) and their passing, then
  runs `_chunk_scan_bwd_dz`, `_chunk_scan_bwd_dstates`, `_state_passing_bwd`, `_chunk_scan_chunk_state_bwd_dx`,
  `_chunk_state_bwd_db`, `_chunk_scan_bwd_dC`, `_chunk_scan_bwd_dcb`, two `_bmm_chunk_bwd`,
  `_chunk_scan_bwd_ddAcs_stable` and `_chunk_cumsum_bwd`, with the torch reductions and cumsums between them;
  last the conv's backward (`causal_conv1d_bwd_function`);
- the mixer's group RMSNorm (`ExtendedRMSNorm`, mamba_ssm/ops/triton/layernorm_gated.py `_layer_norm_fwd` /
  `_layer_norm_bwd`; the gate is already applied inside the scan), forward and backward;
- with a micro-batch of more than one sequence, the `.contiguous()` copies of zxBCdt and of the scan's output
  between Megatron's [s, b, d] and the kernels' [b, s, d] layouts (a single sequence is already contiguous).

Each kernel is priced from the bytes of the tensors it reads and writes (their dtypes from the code above), at
the GPU's HBM bandwidth, and from its FLOPs at the fused-attention rate (the rate of the other fused tensor-core
kernels, `efficiency.attention_time_s`); it takes the longer of the two. At d_state 128 every one of them is
memory-bound. The bytes are each tensor's compulsory traffic, counted once: the heads of a group re-reading
their group's B, C and C B^T are taken as L2 hits, so the figure is a floor. Megatron's chunk size is 128
(`MambaMixer(chunk_size=128)`).

Widths per local token of one GPU: TP splits the heads and the groups; context parallelism (`MambaContextParallel`,
megatron/core/ssm/mamba_context_parallel.py) gathers the whole sequence for heads / CP of them by an all-to-all,
so every kernel sees the same channels per local token, except B and C, which a CP rank repeats when it holds
fewer than one group (CP larger than the TP rank's groups).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from megapilot.estimate.efficiency import EfficiencyParams, attention_time_s
from megapilot.spec.hardware import GPUSpec
from megapilot.spec.model import ModelSpec

SSD_CHUNK_SIZE = 128  # MambaMixer's chunk_size default (Megatron-Core), the scan's Q
STATE_BYTES = 4  # the chunk states `_chunk_state_fwd` writes (states_in_fp32=True), fp32 partial sums
ACTIVATION_BYTES = 2  # bf16 activations and the kernels' 16-bit outputs
FP32_BYTES = 4  # dt, dA_cumsum, C B^T and the partial gradients the kernels write in fp32
DDA_STABLE_BLOCK_M = 32  # `_chunk_scan_bwd_ddAcs_stable`'s BLOCK_SIZE_M_min: its fp32 partials per chunk row


@dataclass(frozen=True)
class MixerKernel:
    """One kernel of the mixer, per local token: bytes read and written through HBM, and FLOPs."""

    name: str
    read_bytes: float
    written_bytes: float
    flops: float = 0.0

    @property
    def moved_bytes(self) -> float:
        return self.read_bytes + self.written_bytes


@dataclass(frozen=True)
class MixerShape:
    """Per local token of one GPU: the scan's channels (d = heads x head_dim), heads, B/C width (groups x N, with
    CP's repeats), conv channels, and the state elements the chunks keep (d N / Q)."""

    inner: float
    heads: float
    group_state: float
    group_chunk: float  # groups x Q: the C B^T entries per token
    conv_channels: float
    states: float
    state_dim: int
    norm_groups: float
    splits: int  # per-block partial copies of dB, dC and dCB (`nsplits` in ssd_chunk_state / ssd_chunk_scan)
    context_parallel: bool = False

    @property
    def in_proj_width(self) -> float:
        """zxBCdt: z, x, B, C and dt."""
        return 2 * self.inner + 2 * self.group_state + self.heads


def context_parallel_all_to_all_bytes(model: ModelSpec, tp: int, cp: int) -> float:
    """Bytes per local token one GPU sends in MambaContextParallel's all-to-alls of one direction: z, x, B, C
    (repeated where a rank holds less than a group) and dt from sequence- to head-sharded before the conv, the
    scan's output back after it (megatron/core/ssm/mamba_context_parallel.py, `pre_conv_ssm`, `post_conv_ssm`)."""
    if cp == 1:
        return 0.0
    shape = mixer_shape(model, tp, cp, 1, SSD_CHUNK_SIZE, 1)
    return ACTIVATION_BYTES * (shape.in_proj_width + shape.inner)


def mixer_shape(model: ModelSpec, tp: int, cp: int, mbs: int, seq_length: int, sms: int) -> MixerShape:
    """The widths one GPU's mixer kernels see per local token (tp and cp as Megatron shards them)."""
    assert model.mamba is not None
    mamba, h = model.mamba, model.hidden_size
    heads, inner, groups, n = mamba.heads(h), mamba.inner_size(h), mamba.num_groups, mamba.state_dim
    # A CP rank holds groups / (TP x CP) groups of the whole sequence, at least one (repeated over CP ranks).
    groups_per_rank = max(1.0, groups / (tp * cp))
    groups_per_token = groups_per_rank * cp
    # nsplits of `_chunk_state_bwd_db`, `_chunk_scan_bwd_dC` and `_chunk_scan_bwd_dcb`: each program sums the
    # heads of a group it holds, ceil(batch x chunks x heads / SMs) of them, and writes its own fp32 partial.
    heads_per_rank = heads / (tp * cp)
    ratio = max(1, round(heads_per_rank / groups_per_rank))
    chunks = math.ceil(seq_length / SSD_CHUNK_SIZE)
    per_program = max(min(math.ceil(mbs * chunks * heads_per_rank / sms), ratio), 1)
    return MixerShape(
        inner=inner / tp, heads=heads / tp, group_state=groups_per_token * n,
        group_chunk=groups_per_token * SSD_CHUNK_SIZE, conv_channels=inner / tp + 2 * groups_per_token * n,
        states=inner / tp * n / SSD_CHUNK_SIZE, state_dim=n, norm_groups=groups / tp,
        splits=math.ceil(ratio / per_program), context_parallel=cp > 1)


def _context_parallel_copies(s: MixerShape) -> list[MixerKernel]:
    """MambaContextParallel's rearrangements around its all-to-alls, each a read and a write: before the conv
    the split heads concatenated for the all-to-all (`_all_to_all_cp2hp`), z, x, B, C, dt concatenated again and
    the attention load balancing undone (`_undo_attention_load_balancing`); after the scan the balancing redone and
    the heads concatenated back (`_all_to_all_hp2cp`). The backward mirrors them."""
    b = ACTIVATION_BYTES
    zxbcdt, y = b * s.in_proj_width, b * s.inner
    return [MixerKernel("CP: cat heads for the all-to-all (zxBCdt)", zxbcdt, zxbcdt),
            MixerKernel("CP: cat z, x, B, C, dt", zxbcdt, zxbcdt),
            MixerKernel("CP: undo attention load balancing", zxbcdt, zxbcdt),
            MixerKernel("CP: redo attention load balancing", y, y),
            MixerKernel("CP: cat heads back (scan output)", y, y)]


def _forward(s: MixerShape, copies: bool) -> list[MixerKernel]:
    b, f = ACTIVATION_BYTES, FP32_BYTES
    d, hd, gn, gq, conv, st, n = s.inner, s.heads, s.group_state, s.group_chunk, s.conv_channels, s.states, s.state_dim
    q = SSD_CHUNK_SIZE
    kernels = _context_parallel_copies(s) if s.context_parallel else []
    if copies:
        kernels.append(MixerKernel("zxBCdt to [b, s, d] (.contiguous)", b * s.in_proj_width, b * s.in_proj_width))
    kernels += [
        MixerKernel("causal_conv1d_fwd (+ SiLU)", b * conv, b * conv),
        MixerKernel("_chunk_cumsum_fwd", b * hd, 2 * f * hd),  # dt in; dt (softplus, + bias) and dA_cumsum out
        MixerKernel("_chunk_state_fwd", b * d + b * gn + 2 * f * hd, STATE_BYTES * st, 2 * d * n),
        MixerKernel("_state_passing_fwd", STATE_BYTES * st, b * st),  # passed states in C's dtype
        MixerKernel("_bmm_chunk_fwd (C B^T)", 2 * b * gn, f * gq, 2 * gq * n),
        # reads C B^T, x, z, dt, dA_cumsum, C and the passed states; writes the gated and the ungated output.
        # FLOPs: C x states, and C B^T x x over the causal half of each chunk.
        MixerKernel("_chunk_scan_fwd", f * gq + 2 * b * d + 2 * f * hd + b * gn + b * st, 2 * b * d,
                    2 * d * n + q * d),
    ]
    if copies:
        kernels.append(MixerKernel("scan output to [s, b, d] (.contiguous)", b * d, b * d))
    kernels.append(MixerKernel("RMSNorm _layer_norm_fwd", b * d, b * d + f * s.norm_groups))
    return kernels


def _backward(s: MixerShape) -> list[MixerKernel]:
    b, f = ACTIVATION_BYTES, FP32_BYTES
    d, hd, gn, gq, conv, st, n = s.inner, s.heads, s.group_state, s.group_chunk, s.conv_channels, s.states, s.state_dim
    q, k = SSD_CHUNK_SIZE, s.splits
    dda_partials = f * hd * math.ceil(q / DDA_STABLE_BLOCK_M)
    return [
        MixerKernel("RMSNorm _layer_norm_bwd", 2 * b * d + f * s.norm_groups, b * d),
        MixerKernel("causal_conv1d_fwd (recomputed x, B, C)", b * conv, b * conv),
        MixerKernel("dt.clone", b * hd, b * hd),
        MixerKernel("_chunk_cumsum_fwd (recomputed)", b * hd, 2 * f * hd),
        MixerKernel("_bmm_chunk_fwd (recomputed C B^T)", 2 * b * gn, f * gq, 2 * gq * n),
        MixerKernel("_chunk_state_fwd (recomputed)", b * d + b * gn + 2 * f * hd, STATE_BYTES * st, 2 * d * n),
        MixerKernel("_state_passing_fwd (recomputed, fp32)", STATE_BYTES * st, STATE_BYTES * st),
        MixerKernel("_chunk_scan_bwd_dz", 4 * b * d, 2 * b * d),  # x, z, out, dout -> dz, dout_x
        MixerKernel("_chunk_scan_bwd_dstates", b * gn + f * hd + b * d, STATE_BYTES * st, 2 * d * n),
        # states and their gradients in fp32 -> the gradients and the states in 16 bits
        MixerKernel("_state_passing_bwd", 2 * STATE_BYTES * st, 2 * b * st),
        MixerKernel("_chunk_scan_chunk_state_bwd_dx", 2 * b * d + f * gq + 2 * f * hd + b * gn + b * st,
                    b * d + f * hd, q * d + 2 * d * n),
        MixerKernel("_chunk_state_bwd_db", b * d + b * st + b * gn + 2 * f * hd, f * gn * k + f * hd, 2 * d * n),
        MixerKernel("dB.sum over splits", f * gn * k, f * gn),
        MixerKernel("torch.cumsum ddA (chunk state)", f * hd, f * hd),
        MixerKernel("_chunk_scan_bwd_dC", b * st + f * hd + b * d + b * gn, f * gn * k + f * hd, 2 * d * n),
        MixerKernel("dC.sum over splits", f * gn * k, f * gn),
        MixerKernel("_chunk_scan_bwd_dcb", 2 * b * d + 2 * f * hd, f * gq * k, q * d),
        MixerKernel("dCB.sum over splits", f * gq * k, f * gq),
        MixerKernel("_bmm_chunk_bwd (dB += dCB C)", b * gn + f * gq + f * gn, b * gn, 2 * gq * n),
        MixerKernel("_bmm_chunk_bwd (dC += dCB^T B)", b * gn + f * gq + f * gn, b * gn, 2 * gq * n),
        MixerKernel("ddA_prev flip", f * hd, f * hd),
        MixerKernel("ddA_prev cumsum", f * hd, f * hd),
        MixerKernel("ddA_prev flip back", f * hd, f * hd),
        MixerKernel("_chunk_scan_bwd_ddAcs_stable", 2 * b * d + 2 * f * hd + f * gq, dda_partials, q * d),
        MixerKernel("ddA partials sum", dda_partials, f * hd),
        MixerKernel("ddA += ddA_next + ddA_prev", 3 * f * hd, f * hd),
        MixerKernel("ddA += (in place)", 2 * f * hd, f * hd),
        MixerKernel("_chunk_cumsum_bwd", 2 * f * hd + b * hd, b * hd),
        MixerKernel("causal_conv1d_bwd (+ SiLU)", 2 * b * conv, b * conv),
        # per-block partials of the parameters' gradients summed: D (twice) and the norm's weight; their size is
        # per parameter, not per token
        MixerKernel("dD sum (dz)", 0.0, 0.0),
        MixerKernel("dD sum (dx)", 0.0, 0.0),
        MixerKernel("RMSNorm dw sum", 0.0, 0.0),
    ]


@lru_cache(maxsize=1024)  # the planner asks for the same few (model, TP, CP, MBS) shapes over and over
def mixer_kernels(model: ModelSpec, tp: int, cp: int, mbs: int, seq_length: int, sms: int) -> tuple[MixerKernel, ...]:
    """Every kernel one Mamba-2 mixer runs per micro-batch, forward then backward, per local token."""
    shape = mixer_shape(model, tp, cp, mbs, seq_length, sms)
    backward_copies = _context_parallel_copies(shape) if shape.context_parallel else []
    return tuple(_forward(shape, copies=mbs > 1) + _backward(shape) + backward_copies)


@lru_cache(maxsize=1024)
def mixer_kernels_s_per_token(model: ModelSpec, tp: int, cp: int, mbs: int, seq_length: int, sms: int, gpu: GPUSpec,
                              eff: EfficiencyParams) -> float:
    """Seconds per local token of the mixer's kernels, forward + backward: each its own roofline, the longer of
    its HBM bytes and its FLOPs at the fused-attention rate."""
    return sum(max(gpu.hbm_time_s(k.moved_bytes), attention_time_s(k.flops, gpu, eff))
               for k in mixer_kernels(model, tp, cp, mbs, seq_length, sms))


# Kernels of one mixer (forward + backward) that every micro-batch runs, whatever its shape (the layout copies of a
# multi-sequence micro-batch and of context parallelism left out): what `latency.layer_kernels` counts for the
# per-kernel overhead.
_ANY_SHAPE = MixerShape(inner=1, heads=1, group_state=1, group_chunk=1, conv_channels=1, states=1, state_dim=1,
                        norm_groups=1, splits=1)
MIXER_KERNELS = len(_forward(_ANY_SHAPE, copies=False)) + len(_backward(_ANY_SHAPE))
