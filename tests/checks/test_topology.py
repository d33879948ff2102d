"""gpu-topology on real `nvidia-smi topo -m` outputs."""

from conftest import recorded_gpus, recorded_topology, severities

from sftdoctor.checks import Skipped


def test_nvswitch_boxes_are_all_nvlink(run):
    for name, code in [("dgx_a100_8x_mlx5_gengwg.txt", "NV12"), ("h100_8x_nic_legend_princeton_pli.txt", "NV18")]:
        findings = run("gpu-topology", topology=recorded_topology(name))
        assert severities(findings) == ["ok"]
        assert "all 28 pairs" in findings[0].title and code in findings[0].title


def test_v100_hybrid_cube_mesh_lists_the_unlinked_pairs_but_is_not_a_problem(run):
    findings = run("gpu-topology", topology=recorded_topology("dgx1_8xv100_sxm2_oneflow_dlperf.txt"))
    assert severities(findings) == ["info"]
    assert "12 of 28" in findings[0].title and "GPU0-GPU5 SYS" in findings[0].detail


def test_bridged_consumer_pairs_form_islands_joined_by_pcie(run):
    findings = run("gpu-topology", topology=recorded_topology("rtx3090_4x_nvlink_pairs_aikitoria_pr18.txt"))
    assert severities(findings) == ["warning"]
    assert "islands [0,2 | 1,3]" in findings[0].title


def test_pcie_only_box_is_a_warning_with_the_bandwidth_cost(run):
    findings = run("gpu-topology", topology=recorded_topology("rtx4090_8x_pcie_2nic_go_gpuallocator17.txt"))
    assert severities(findings) == ["warning"]
    assert "no NVLink between the 8 GPUs" in findings[0].title and "worst path SYS" in findings[0].title
    assert "GB per GPU per optimizer step" in findings[0].detail and "host memory" in findings[0].detail


def test_old_soc_output_reads_as_sys(run):
    findings = run("gpu-topology", topology=recorded_topology("k40m_4x_soc_mlx4_tensorflow_gdr.txt"))
    assert "worst path SYS" in findings[0].title


def test_cuda_visible_devices_narrows_to_the_gpus_in_use(run):
    topo = recorded_topology("rtx3090_4x_nvlink_pairs_aikitoria_pr18.txt")
    findings = run("gpu-topology", topology=topo, env={"CUDA_VISIBLE_DEVICES": "0,2"})
    assert severities(findings) == ["ok"] and "NV4" in findings[0].title
    findings = run("gpu-topology", topology=topo, env={"CUDA_VISIBLE_DEVICES": "1"})
    assert severities(findings) == ["ok"] and "one GPU" in findings[0].title


def test_p2p_disabled_is_flagged_even_on_nvlink(run):
    findings = run(
        "gpu-topology", topology=recorded_topology("dgx_a100_8x_mlx5_gengwg.txt"), env={"NCCL_P2P_DISABLE": "1"}
    )
    assert severities(findings) == ["ok", "warning"]
    assert "NCCL_P2P_DISABLE" in findings[1].title


def test_without_a_matrix_nvml_link_counts_still_tell(run):
    gpus = recorded_gpus("h100_sxm_8x_driver550_modal_glossary.txt")
    for device in gpus["devices"]:
        device["nvlink_links_up"] = 18
    assert severities(run("gpu-topology", gpus=gpus)) == ["ok"]
    for device in gpus["devices"]:
        device["nvlink_links_up"] = None
    assert isinstance(run("gpu-topology", gpus=gpus), Skipped)


def _pasted(text):
    from sftdoctor.facts.topology import parse_topology

    return {"source": "paste", **parse_topology(text, "paste")}


FOUR = (
    "\tGPU0\tGPU1\tGPU2\tGPU3\n"
    "GPU0\t X \tNV4\tNV4\tNV4\n"
    "GPU1\tNV4\t X \tNV4\tNV4\n"
    "GPU2\tNV4\tNV4\t X \tNV4\n"
    "GPU3\tNV4\tNV4\tNV4\t X \n"
)


def test_a_cut_off_last_row_is_judged_from_its_column_and_the_verdict_says_so(run):
    findings = run("gpu-topology", topology=_pasted(FOUR[: FOUR.index("GPU3\tNV4\tNV4") + 9]))
    assert severities(findings) == ["ok"] and "all 6 pairs" in findings[0].title
    assert "GPU3: row cut after 1 of 4 link codes" in findings[0].detail
    assert findings[0].evidence["incomplete"] == {"GPU3": "row cut after 1 of 4 link codes"}


def test_pairs_the_matrix_does_not_show_are_not_passed(run):
    """GPU2 and GPU3 have no rows: their own pair is shown nowhere, so no ✓ for all pairs."""
    findings = run("gpu-topology", topology=_pasted(FOUR[: FOUR.index("GPU2\tNV4")]))
    assert severities(findings) == ["info"]
    assert findings[0].title == "cannot judge 1 of 6 GPU pairs: the matrix does not show them"
    assert "Not shown: GPU2-GPU3" in findings[0].detail
    assert findings[0].evidence["unknown_pairs"] == ["GPU2-GPU3"]


def test_pcie_islands_are_still_a_warning_when_some_pairs_are_not_shown(run):
    split = FOUR.replace("GPU0\t X \tNV4\tNV4\tNV4", "GPU0\t X \tNV4\tSYS\tSYS").replace(
        "GPU1\tNV4\t X \tNV4\tNV4", "GPU1\tNV4\t X \tSYS\tSYS"
    )
    findings = run("gpu-topology", topology=_pasted(split[: split.index("\nGPU2\t") + 1]))
    assert severities(findings) == ["warning"] and "islands" in findings[0].title


def test_islands_that_a_pair_the_matrix_does_not_show_could_join_are_not_called_islands(run):
    """GPU0-GPU2 and GPU1-GPU3 are NVLink pairs; GPU2-GPU3, both rows missing, may be NVLink too."""
    text = "\tGPU0\tGPU1\tGPU2\tGPU3\nGPU0\t X \tSYS\tNV4\tSYS\nGPU1\tSYS\t X \tSYS\tNV4\n"
    findings = run("gpu-topology", topology=_pasted(text))
    assert severities(findings) == ["info"] and findings[0].title.startswith("cannot judge 1 of 6 GPU pairs")
