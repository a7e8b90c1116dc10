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
    assert {g["alias"] for g in result.json()} == set(ALIASES)
