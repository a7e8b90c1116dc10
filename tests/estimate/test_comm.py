"""Collective times (ring bandwidth terms) and which link a process group runs on."""

from __future__ import annotations

import random

import pytest

from megapilot.catalog.gpus import get_gpu
from megapilot.estimate import comm
from megapilot.estimate.efficiency import COLLECTIVE_BW_EFFICIENCY
from megapilot.spec import ClusterSpec

H100 = get_gpu("h100")
GB200 = get_gpu("gb200")


def test_ring_all_reduce_moves_twice_g_minus_one_over_g_of_the_buffer():
    # 8 GB over 8 ranks at 100 GB/s: reduce-scatter and all-gather each move 7/8 x 8 GB = 7 GB -> 0.07 s.
    assert comm.all_gather_s(8e9, 8, 100e9) == pytest.approx(0.07)
    assert comm.reduce_scatter_s(8e9, 8, 100e9) == pytest.approx(0.07)
    assert comm.all_reduce_s(8e9, 8, 100e9) == pytest.approx(0.14)


def test_all_reduce_of_one_gb_inside_an_h100_node_takes_about_five_ms():
    bandwidth = comm.group_bandwidth_bytes_per_s(ClusterSpec.from_gpu_count(H100, 8), 8)
    # 2 x 7/8 x 1e9 B / (450 GB/s x 0.75) = 1.75e9 / 337.5e9 s
    assert comm.all_reduce_s(1e9, 8, bandwidth) == pytest.approx(5.185e-3, rel=1e-3)


def test_all_to_all_sends_g_minus_one_over_g_off_gpu():
    assert comm.all_to_all_s(4e9, 4, 1e9) == pytest.approx(3.0)


@pytest.mark.parametrize("collective", [comm.all_gather_s, comm.reduce_scatter_s, comm.all_reduce_s,
                                        comm.all_to_all_s])
@pytest.mark.parametrize("group", [0, 1])
def test_a_group_of_one_rank_communicates_nothing(collective, group):
    assert collective(1e9, group, 1e9) == 0.0


def test_collective_time_grows_with_the_group_towards_the_full_buffer():
    times = [comm.all_gather_s(1e9, g, 1e9) for g in (2, 4, 8, 64, 1024)]
    assert times == sorted(times)
    assert times[0] == pytest.approx(0.5) and times[-1] < 1.0


def test_point_to_point_is_message_over_bandwidth():
    assert comm.p2p_s(3e9, 1.5e9) == pytest.approx(2.0)


def test_scaleup_domain_is_the_node_on_hgx_and_the_rack_on_nvl72():
    assert comm.scaleup_domain(ClusterSpec.from_gpu_count(H100, 64)) == 8
    assert comm.scaleup_domain(ClusterSpec.from_gpu_count(GB200, 72)) == 72  # 18 trays of 4 GPUs


def test_scaleup_domain_of_an_hgx_gpu_on_smaller_nodes_stops_at_the_node():
    four_per_node = ClusterSpec.from_gpu_count(H100, 16, gpus_per_node=4)
    assert comm.scaleup_domain(four_per_node) == 4
    bandwidth = comm.group_bandwidth_bytes_per_s(four_per_node, 8)
    assert bandwidth == pytest.approx(4 * 50e9 * COLLECTIVE_BW_EFFICIENCY)  # crosses nodes: 4 NICs per node


def test_groups_inside_the_nvlink_domain_use_nvlink_and_beyond_it_the_nics():
    cluster = ClusterSpec.from_gpu_count(H100, 64)
    nvlink = comm.group_bandwidth_bytes_per_s(cluster, 8)
    one_rank_per_node = comm.group_bandwidth_bytes_per_s(cluster, 8, stride=8)
    four_ranks_per_node = comm.group_bandwidth_bytes_per_s(cluster, 16, stride=2)
    assert nvlink == pytest.approx(450e9 * COLLECTIVE_BW_EFFICIENCY)
    assert one_rank_per_node == pytest.approx(50e9 * COLLECTIVE_BW_EFFICIENCY)
    assert four_ranks_per_node == pytest.approx(4 * 50e9 * COLLECTIVE_BW_EFFICIENCY)


def test_nic_bandwidth_of_a_group_never_exceeds_the_scaleup_link():
    # B300: 8 ranks per node x 100 GB/s NICs = 800 GB/s, under NVLink's 900; GB300 rack-wide stays NVLink.
    b300 = ClusterSpec.from_gpu_count(get_gpu("b300"), 32)
    assert comm.group_bandwidth_bytes_per_s(b300, 32) == pytest.approx(800e9 * COLLECTIVE_BW_EFFICIENCY)
    a100 = ClusterSpec.from_gpu_count(get_gpu("a100"), 64)
    wide = comm.group_bandwidth_bytes_per_s(a100, 64)
    assert wide <= a100.gpu.scaleup_bw_gbps * 1e9 * COLLECTIVE_BW_EFFICIENCY
    assert wide == pytest.approx(8 * 25e9 * COLLECTIVE_BW_EFFICIENCY)


def test_a_group_spanning_trays_of_an_nvl72_rack_stays_on_nvlink():
    rack = ClusterSpec.from_gpu_count(GB200, 72)
    assert comm.group_bandwidth_bytes_per_s(rack, 64) == pytest.approx(900e9 * COLLECTIVE_BW_EFFICIENCY)
    two_racks = ClusterSpec.from_gpu_count(GB200, 144)
    # Two ranks per rack (36 apart): the rack boundary is crossed through those two ranks' NICs.
    assert comm.group_bandwidth_bytes_per_s(two_racks, 4, stride=36) == pytest.approx(
        2 * 50e9 * COLLECTIVE_BW_EFFICIENCY)


def test_a_group_spanning_nvl72_racks_crosses_them_through_every_nic_of_its_ranks_in_the_rack():
    """Not the 4-GPU tray's NICs: a DP group of 64 (stride TP 2) over two racks has 36 ranks in the first rack,
    36 NICs x 50 GB/s, which is more than NVLink's 900 GB/s, so NVLink stays the limit."""
    two_racks = ClusterSpec.from_gpu_count(GB200, 128)
    assert comm.group_bandwidth_bytes_per_s(two_racks, 64, stride=2) == pytest.approx(
        900e9 * COLLECTIVE_BW_EFFICIENCY)
    four_per_rack = comm.group_bandwidth_bytes_per_s(two_racks, 8, stride=16)  # 72 // 16 = 4 ranks in the rack
    assert four_per_rack == pytest.approx(4 * 50e9 * COLLECTIVE_BW_EFFICIENCY)


def test_an_expert_all_to_all_across_nodes_is_limited_by_each_ranks_own_nic():
    """Each rank sends its off-node share through its own NIC (no ring funnels it); the on-node share moves
    over NVLink meanwhile, so a group on one node runs at NVLink speed and one over 4 nodes at NIC speed."""
    expert_all_to_all_s = comm.expert_all_to_all_s
    gpu = get_gpu("h100")
    cluster = ClusterSpec.from_gpu_count(gpu, 64)
    sent = 1e9
    inside = expert_all_to_all_s(sent, cluster, 8)
    assert inside == pytest.approx(7 / 8 * sent / (gpu.scaleup_bw_gbps * 1e9 * COLLECTIVE_BW_EFFICIENCY))
    across = expert_all_to_all_s(sent, cluster, 32)
    assert across == pytest.approx(24 / 32 * sent / (gpu.scaleout_bw_gbps * 1e9 * COLLECTIVE_BW_EFFICIENCY))
    assert expert_all_to_all_s(sent, cluster, 1) == 0.0
    # ETP 2 spreads EP 8 over 16 GPUs: half of each rank's peers sit on the other node.
    assert expert_all_to_all_s(sent, cluster, 8, stride=2) == pytest.approx(
        4 / 8 * sent / (gpu.scaleout_bw_gbps * 1e9 * COLLECTIVE_BW_EFFICIENCY))


def test_a_tokens_top_k_experts_touch_fewer_domains_than_k():
    """DeepSeek-V3's 256 experts over 8 domains, top-8: a domain of 32 is missed with probability
    C(224, 8) / C(256, 8) = 0.338, so a token reaches 8 x 0.662 = 5.29 domains, not 8."""
    assert comm.expected_groups_touched(256, 8, 8) == pytest.approx(5.29, abs=0.01)
    assert comm.expected_groups_touched(256, 8, 1) == 1.0
    assert comm.expected_groups_touched(64, 1, 8) == pytest.approx(1.0)  # top-1 always touches one domain
    assert comm.expected_groups_touched(16, 9, 2) == pytest.approx(2.0)  # 9 of 16 cannot stay in one half of 8


def _simulated_domains_touched(experts: int, topk: int, domains: int, groups: int, group_topk: int) -> float:
    """Group-limited routing drawn at random: r of the R groups, then k experts among theirs (balanced)."""
    rng = random.Random(7)
    per_group, per_domain, draws, touched = experts // groups, experts // domains, 20000, 0
    for _ in range(draws):
        picked = rng.sample(range(groups), group_topk)
        pool = [g * per_group + i for g in picked for i in range(per_group)]
        touched += len({expert // per_domain for expert in rng.sample(pool, topk)})
    return touched / draws


@pytest.mark.parametrize("domains", [2, 4, 8, 16, 32])
def test_node_limited_routing_bounds_the_domains_a_token_reaches(domains: int):
    """DeepSeek-V3 routes each token within 4 of 8 expert groups (`--moe-router-num-groups 8
    --moe-router-group-topk 4`): over 8 domains, one group each, a token reaches about 3.6 of them, not the 5.3
    of free routing; the closed form matches a random draw of the routing for blocks that hold or split groups."""
    exact = comm.expected_groups_touched(256, 8, domains, 8, 4)
    assert exact == pytest.approx(_simulated_domains_touched(256, 8, domains, 8, 4), rel=0.02)
    assert exact <= comm.expected_groups_touched(256, 8, domains) + 1e-9
    assert comm.expected_groups_touched(256, 8, domains, 8, 8) == pytest.approx(
        comm.expected_groups_touched(256, 8, domains))  # every group open: free routing


def test_a_dispatcher_that_sends_once_per_domain_shrinks_only_the_cross_domain_share():
    cluster = ClusterSpec.from_gpu_count(get_gpu("h100"), 64)
    full = comm.expert_all_to_all_s(1e9, cluster, 32)
    halved = comm.expert_all_to_all_s(1e9, cluster, 32, cross_domain_share=0.5)
    assert halved == pytest.approx(full / 2)  # the NIC share sets the time across nodes
    inside = comm.expert_all_to_all_s(1e9, cluster, 8)
    assert comm.expert_all_to_all_s(1e9, cluster, 8, cross_domain_share=0.5) == inside  # nothing leaves the node
