from __future__ import annotations

import json

import pytest

from megapilot.catalog.gpus import get_gpu, load_gpus
from megapilot.errors import MegapilotError

ALIASES = ["a100", "h100", "h200", "h800", "b200", "gb200", "b300", "gb300", "mi300x", "mi325x", "mi355x"]


@pytest.mark.parametrize("alias", ALIASES)
def test_every_alias_resolves_and_has_peaks(alias):
    gpu = get_gpu(alias.upper())
    assert gpu.alias == alias
    assert gpu.bf16_dense_tflops > 100 and gpu.hbm_gib >= 80
    assert get_gpu(gpu.name) == gpu


def test_fp8_only_where_the_hardware_has_it():
    assert not get_gpu("a100").supports("fp8")
    assert get_gpu("h100").supports("fp8") and get_gpu("mi300x").supports("fp8")
    assert get_gpu("b200").supports("nvfp4") and not get_gpu("h100").supports("nvfp4")


def test_unknown_gpu_lists_known_ones():
    with pytest.raises(MegapilotError) as err:
        get_gpu("v100")
    assert err.value.field == "gpu" and "h100" in err.value.fix


def test_user_file_overrides_catalog(tmp_path):
    row = get_gpu("h100").model_dump() | {"name": "H100-SXM5-80GB", "bf16_dense_tflops": 900.0}
    custom = dict(row, name="MyGPU", alias="mygpu")
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps([custom]))
    load_gpus.cache_clear()
    assert get_gpu("mygpu", extra_file=str(path)).bf16_dense_tflops == 900.0


def test_gpus_cli_json(cli):
    result = cli("gpus", "--json")
    assert result.exit_code == 0
    assert {g["alias"] for g in result.json()} == set(ALIASES) | {"cpu"}  # this machine's CPU, measured


# ---- block-scaled format peaks, node and NVLink-domain sizes (gpu_formats.json) ---------------------------------

_FORMAT_FIELDS = ("mxfp8_dense_tflops", "nvfp4_dense_tflops", "mxfp4_dense_tflops")


def test_every_catalog_gpu_has_its_node_and_domain_sizes_and_a_source_for_each_figure():
    from megapilot.catalog.gpus import gpu_formats

    rows = gpu_formats()
    for spec in load_gpus().values():
        row = rows[spec.name]
        assert (spec.gpus_per_node, spec.scaleup_domain_gpus) == (row["gpus_per_node"], row["scaleup_domain_gpus"])
        assert spec.scaleup_domain_gpus % spec.gpus_per_node == 0  # a node never straddles two domains
        assert row["sources"]["topology"]
        for field in (*_FORMAT_FIELDS, "bf16_dense_tflops", "fp4_dense_tflops"):
            if field in row:
                assert row["sources"][field], f"{spec.name} {field} has no source"


def test_gb200_and_gb300_are_4_gpu_trays_in_a_72_gpu_nvlink_domain():
    from megapilot.spec.hardware import ClusterSpec, default_gpus_per_node

    for alias in ("gb200", "gb300"):
        gpu = get_gpu(alias)
        assert (gpu.gpus_per_node, gpu.scaleup_domain_gpus, default_gpus_per_node(gpu)) == (4, 72, 4)
        assert ClusterSpec.from_gpu_count(gpu, 72).num_nodes == 18  # one NVL72 rack: 18 compute trays
    assert default_gpus_per_node(get_gpu("b200")) == 8 and get_gpu("mi355x").gpus_per_node == 8


@pytest.mark.parametrize("alias", ALIASES)
def test_format_peaks_exist_exactly_where_the_architecture_runs_the_format(alias):
    gpu = get_gpu(alias)
    assert (gpu.mxfp8_dense_tflops is not None) == gpu.supports("mxfp8")
    assert (gpu.nvfp4_dense_tflops is not None) == gpu.supports("nvfp4")
    assert (gpu.mxfp4_dense_tflops is not None) == (gpu.architecture in ("blackwell", "cdna4"))
    if gpu.mxfp8_dense_tflops is not None:  # block scales are applied inside the MMA: the FP8 rate
        assert gpu.mxfp8_dense_tflops == gpu.fp8_dense_tflops
    if gpu.mxfp4_dense_tflops is not None:  # the FP4 rate, twice FP8's on both vendors' parts
        assert gpu.mxfp4_dense_tflops == gpu.fp4_dense_tflops >= 2 * (gpu.fp8_dense_tflops or 0)
        assert gpu.nvfp4_dense_tflops in (None, gpu.fp4_dense_tflops)


def test_mi355x_bf16_is_half_its_fp8_as_its_per_cu_rates_say():
    gpu = get_gpu("mi355x")
    assert gpu.bf16_dense_tflops == gpu.fp8_dense_tflops / 2 == 2500.0
    assert get_gpu("b300").fp4_dense_tflops == 13125.0  # HGX B300 105 PF dense / 8, replacing 14000


def test_a_figure_that_disagrees_with_hardware_json_without_naming_it_is_refused(monkeypatch):
    from megapilot.catalog import gpus

    row = next(r for r in json.loads(
        (gpus.resources.files("megapilot.catalog") / "data" / "hardware.json").read_text()) if r["name"] == "B200")
    formats = dict(gpus.gpu_formats())
    monkeypatch.setattr(gpus, "gpu_formats", lambda: formats | {"B200": formats["B200"] | {"fp8_dense_tflops": 1.0}})
    with pytest.raises(ValueError, match="replaces"):
        gpus._row_to_spec(row)
    named = formats["B200"] | {"fp8_dense_tflops": 4400.0, "replaces": {"fp8_dense_tflops": 4500.0}}
    monkeypatch.setattr(gpus, "gpu_formats", lambda: formats | {"B200": named})
    assert gpus._row_to_spec(row).fp8_dense_tflops == 4400.0


def test_the_host_link_is_pcie_on_hgx_and_a_share_of_nvlink_c2c_on_a_grace_superchip():
    assert get_gpu("a100").host_link_gbps == 32.0  # PCIe Gen4 x16
    assert get_gpu("h100").host_link_gbps == get_gpu("b200").host_link_gbps == 64.0  # PCIe Gen5 x16
    # 900 GB/s bidirectional per Grace, which serves two GPUs: 225 per GPU per direction
    assert get_gpu("gb200").host_link_gbps == get_gpu("gb300").host_link_gbps == 225.0


@pytest.mark.parametrize(("system", "gpu"), [("DGX-GB300", "GB300"), ("DGX-B200", "B200"), ("GB200 NVL72", "GB200"),
                                             ("HGX H100", "H100-SXM5-80GB")])
def test_a_system_named_as_the_tables_name_it_is_the_gpu_it_is_built_of(system, gpu):
    assert get_gpu(system).name == gpu


def test_an_unknown_system_is_refused_by_field():
    with pytest.raises(MegapilotError) as refused:
        get_gpu("DGX-X9")
    assert refused.value.field == "gpu"


def test_host_memory_per_gpu_is_the_node_dram_over_its_gpus():
    # 2 TB over 8 GPUs on DGX-class systems; a Grace's 480 GB over its two GPUs on GB200 / GB300
    assert get_gpu("h100").host_memory_gib == pytest.approx(250e9 / 2**30)
    assert get_gpu("b200").host_memory_gib == pytest.approx(250e9 / 2**30)
    assert get_gpu("gb200").host_memory_gib == get_gpu("gb300").host_memory_gib == pytest.approx(240e9 / 2**30)
