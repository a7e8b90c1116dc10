"""Collective-communication times (ring algorithms) and which link a process group runs on.

Megatron orders ranks TP fastest, then CP, DP, and PP slowest (expert groups: ETP, then EP); a group
whose ranks span at most the NVLink/xGMI domain talks over scale-up links, otherwise the slowest hop
is the per-GPU scale-out NIC. Costs are the bandwidth terms of the ring algorithms (Thakur et al. 2005,
"Optimization of Collective Communication Operations in MPICH"): all-gather and reduce-scatter move
(g-1)/g of the full buffer per GPU, all-reduce twice that, all-to-all (g-1)/g of what a rank sends.
Latency terms are left out: Megatron's buckets and activations are megabytes, where bandwidth rules.
"""

from __future__ import annotations

import math

from megapilot.estimate.efficiency import COLLECTIVE_BW_EFFICIENCY
from megapilot.spec.hardware import ClusterSpec


def scaleup_domain(cluster: ClusterSpec) -> int:
    """GPUs that share NVLink/xGMI (`ClusterSpec.scaleup_domain_gpus`)."""
    return cluster.scaleup_domain_gpus


def group_bandwidth_bytes_per_s(cluster: ClusterSpec, group: int, stride: int = 1) -> float:
    """Achievable per-GPU bandwidth of a process group of `group` ranks spaced `stride` ranks apart.

    Inside the scale-up domain: the NVLink/xGMI bandwidth. Across it, NCCL's rings/trees cross each
    domain boundary once per channel and spread that traffic over the NICs of the group's ranks in the
    domain (the hops inside it ride NVLink), so the group moves data at `ranks per domain x NIC
    bandwidth`, capped by the scale-up link. On 8-GPU nodes the domain is the node; on NVL72-class
    racks it is the rack, not the 4-GPU tray: a data-parallel group spread over two racks has 36 or so
    NICs per crossing, not the tray's 4.
    """
    gpu = cluster.gpu
    domain = scaleup_domain(cluster)
    if group * stride <= domain:
        link_gbps = gpu.scaleup_bw_gbps
    else:
        ranks_per_domain = max(1, min(group, domain // stride))
        link_gbps = min(gpu.scaleup_bw_gbps, ranks_per_domain * gpu.scaleout_bw_gbps)
    return link_gbps * 1e9 * COLLECTIVE_BW_EFFICIENCY


def all_gather_s(buffer_bytes: float, group: int, bandwidth: float) -> float:
    """Ring all-gather of a `buffer_bytes` result over `group` ranks."""
    return 0.0 if group <= 1 else (group - 1) / group * buffer_bytes / bandwidth


def reduce_scatter_s(buffer_bytes: float, group: int, bandwidth: float) -> float:
    """Ring reduce-scatter of a `buffer_bytes` input over `group` ranks."""
    return all_gather_s(buffer_bytes, group, bandwidth)


def all_reduce_s(buffer_bytes: float, group: int, bandwidth: float) -> float:
    """Ring all-reduce = reduce-scatter + all-gather."""
    return 2 * all_gather_s(buffer_bytes, group, bandwidth)


def all_to_all_s(sent_bytes: float, group: int, bandwidth: float) -> float:
    """All-to-all where each rank sends `sent_bytes` in total, (g-1)/g of it off-GPU."""
    return all_gather_s(sent_bytes, group, bandwidth)


def expert_all_to_all_s(
    sent_bytes: float, cluster: ClusterSpec, group: int, stride: int = 1, *, cross_domain_share: float = 1.0
) -> float:
    """All-to-all of an expert-parallel group, each rank sending `sent_bytes` spread evenly over its peers.

    Unlike a ring, an all-to-all does not funnel a node's traffic through one crossing: every rank sends
    its share for each off-domain peer through its own NIC, while the share for peers in its NVLink/xGMI
    domain moves over the scale-up links at the same time. The slower of the two sets the time.
    `cross_domain_share` scales what leaves the domain: a dispatcher that sends a token once per remote
    domain and fans it out there over NVLink (DeepEP, HybridEP) moves less than one copy per expert.
    """
    if group <= 1:
        return 0.0
    gpu = cluster.gpu
    local = max(1, min(group, scaleup_domain(cluster) // stride))  # peers (itself included) in its domain
    inside = (local - 1) / group * sent_bytes
    outside = (group - local) / group * sent_bytes * cross_domain_share
    scaleup = gpu.scaleup_bw_gbps * 1e9 * COLLECTIVE_BW_EFFICIENCY
    scaleout = gpu.scaleout_bw_gbps * 1e9 * COLLECTIVE_BW_EFFICIENCY
    return max(inside / scaleup, outside / scaleout)


def p2p_s(message_bytes: float, bandwidth: float) -> float:
    """One point-to-point send."""
    return message_bytes / bandwidth


def expected_groups_touched(experts: int, topk: int, groups: int, routing_groups: int | None = None,
                            routing_group_topk: int | None = None) -> float:
    """Expected number of `groups` equal blocks of experts that a token's top-k distinct experts fall in.

    With the k experts drawn uniformly without replacement (balanced routing), a block of E/G experts is
    missed with probability C(E - E/G, k) / C(E, k). Group-limited routing (`--moe-router-num-groups` R,
    `--moe-router-group-topk` r: DeepSeek-V3's node-limited routing) first picks r of the R routing groups, then
    the k experts among theirs; where each block holds whole routing groups (R a multiple of G), a block is missed
    when none of its groups is picked or none of the k experts falls in the picked ones it holds; where a routing
    group spans blocks (G a multiple of R), only the picked groups' blocks can be touched."""
    if groups <= 1:
        return 1.0
    if routing_groups is None or routing_group_topk is None or (routing_groups % groups and groups % routing_groups):
        return groups * _touch_probability(experts, topk, experts / groups)
    if groups % routing_groups == 0:  # a routing group spans blocks: the k experts fall in the picked groups' blocks
        blocks = routing_group_topk * groups // routing_groups
        pool = routing_group_topk * experts / routing_groups
        return blocks * _touch_probability(pool, topk, experts / groups)
    held = routing_groups // groups  # routing groups per block
    per_routing_group = experts / routing_groups
    pool = routing_group_topk * per_routing_group  # the experts of the picked groups
    missed = 0.0
    for picked_here in range(0, min(held, routing_group_topk) + 1):
        ways = math.comb(held, picked_here) * math.comb(routing_groups - held, routing_group_topk - picked_here)
        chance = ways / math.comb(routing_groups, routing_group_topk)
        missed += chance * (1 - _touch_probability(pool, topk, picked_here * per_routing_group))
    return groups * (1 - missed)


def _touch_probability(pool: float, topk: int, block: float) -> float:
    """Probability that k experts drawn without replacement from `pool` include one of a `block` of them."""
    missed = 1.0
    for i in range(topk):
        missed *= max(0.0, (pool - block - i) / (pool - i)) if pool - i > 0 else 0.0
    return 1 - missed
