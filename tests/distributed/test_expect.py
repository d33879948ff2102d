"""What recorded real topologies promise for an all-reduce (tests/fixtures/topology cites each)."""

import pytest
from conftest import recorded_topology

from sftdoctor.distributed.expect import EFFICIENCY, intra_node, pcie_generation


@pytest.mark.parametrize(
    "name, cc, links, per_link",
    [
        ("dgx_a100_8x_mlx5_gengwg.txt", "8.0", 12, 25),  # NVSwitch: every pair shows the GPU's 12 links
        ("h100_8x_nic_legend_princeton_pli.txt", "9.0", 18, 25),
        ("a800_8x_nv8_nic_legend_llm_action.txt", "8.0", 8, 25),  # the China-market A100 with 8 NVLinks
        ("dgx1_8xv100_sxm2_oneflow_dlperf.txt", "7.0", 6, 25),  # hybrid cube mesh: 2 x NV1 + 2 x NV2 per GPU
    ],
)
def test_nvlink_nodes_promise_their_links_over_a_ring(name, cc, links, per_link):
    expected = intra_node(recorded_topology(name), cc)
    assert expected["via"] == "nvlink"
    assert expected["busbw_gbps"] == pytest.approx(links * per_link * EFFICIENCY)


def test_nvlink_pairs_that_do_not_join_every_gpu_leave_the_ring_on_pcie():
    """Two bridged RTX 3090 pairs: NCCL's ring must cross PCIe between the pairs."""
    expected = intra_node(recorded_topology("rtx3090_4x_nvlink_pairs_aikitoria_pr18.txt"), "8.6")
    assert expected["via"] == "pcie" and "PCIe 4" in expected["why"]


@pytest.mark.parametrize(
    "name, cc, worst, generation",
    [
        ("rtx4090_8x_pcie_2nic_go_gpuallocator17.txt", "8.9", "SYS", 4),
        ("l40s_4x_pcie_nic_legend_missalignment106.txt", "8.9", "SYS", 4),
        ("titanx_4x_single_root_horovod969.txt", "6.1", "PHB", 3),
        ("k40m_4x_soc_mlx4_tensorflow_gdr.txt", "3.5", "SYS", 3),  # the old SOC name of SYS
    ],
)
def test_pcie_nodes_are_paced_by_their_slowest_hop(name, cc, worst, generation):
    expected = intra_node(recorded_topology(name), cc)
    assert (
        expected["via"] == "pcie" and f"through {worst}" in expected["why"] and f"PCIe {generation}" in expected["why"]
    )


def test_a_cross_socket_hop_halves_what_a_single_root_promises():
    one_root = intra_node(recorded_topology("titanx_4x_single_root_horovod969.txt"), "6.1")
    two_roots = intra_node(recorded_topology("titanx_4x_dual_root_horovod969.txt"), "6.1")
    assert two_roots["busbw_gbps"] < one_root["busbw_gbps"]


def test_pcie_generation_follows_the_gpu_generation():
    assert [pcie_generation(cc) for cc in ("7.0", "8.0", "8.9", "9.0", "12.0", None, "x")] == [3, 4, 4, 5, 5, 3, 3]


def test_ibstat_ports_of_recorded_nodes_and_what_they_promise_across_nodes():
    from conftest import FIXTURES, index
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from sftdoctor.distributed.expect import inter_node
    from sftdoctor.facts.nics import active_gbps, parse_ibstat

    for entry in index("ibstat"):
        nics = parse_ibstat((FIXTURES / "ibstat" / entry["file"]).read_text())
        assert sum(p["state"] == "Active" for p in nics["ports"]) == entry["expect"]["active_ports"]
        assert active_gbps(nics) == entry["expect"]["total_gbps"]
    two = inter_node(parse_ibstat((FIXTURES / "ibstat" / "cx6dx_2x100g_roce_l2fwd_nv6.txt").read_text()))
    assert two["busbw_gbps"] == pytest.approx(200 / 8 * EFFICIENCY) and two["via"] == "network"
    assert inter_node({"ports": []}) is None

    @settings(max_examples=200, deadline=None)
    @given(st.text(alphabet=st.sampled_from(list("CA 'mlx5_0\nPort 1:\tState: Active Rate: 2.5x")), max_size=300))
    def never_raises(text):
        parse_ibstat(text)

    never_raises()
