"""LaunchOptions: defaults, and refusals that name the field; LaunchScript's stable JSON."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from megapilot.launch.options import DEFAULT_MASTER_PORT, LaunchOptions, LaunchScript


def _refused_fields(**fields: object) -> set[str]:
    with pytest.raises(ValidationError) as err:
        LaunchOptions(**fields)
    return {str(error["loc"][0]) for error in err.value.errors()}


def test_defaults_launch_megatron_with_torchrun_on_the_plans_nodes():
    options = LaunchOptions()
    assert (options.launcher, options.entrypoint, options.rendezvous) == ("torchrun", "megatron", "static")
    assert options.nodes is None and options.save_interval is None and options.check_paths_exist is None
    assert options.split == "99,1,0" and options.log_interval == 1 and options.timing_log_level == 1


def test_the_default_master_port_is_not_torchruns_29500():
    assert LaunchOptions().master_port == DEFAULT_MASTER_PORT != 29500


@pytest.mark.parametrize(("fields", "field"), [
    ({"nodes": 0}, "nodes"),
    ({"save_interval": 0}, "save_interval"),
    ({"log_interval": -1}, "log_interval"),
    ({"master_port": 1024}, "master_port"),  # privileged
    ({"master_port": 65536}, "master_port"),
    ({"timing_log_level": 3}, "timing_log_level"),
    ({"launcher": "mpirun"}, "launcher"),
    ({"entrypoint": "pretrain_gpt.py"}, "entrypoint"),
    ({"rendezvous": "etcd"}, "rendezvous"),
    ({"tokenizer_type": "WordPiece"}, "tokenizer_type"),
])
def test_an_out_of_range_or_unknown_value_is_refused_naming_its_field(fields, field):
    assert _refused_fields(**fields) == {field}


def test_each_bad_field_is_named_when_several_are_wrong():
    assert _refused_fields(nodes=0, master_port=80, launcher="mpirun") == {"nodes", "master_port", "launcher"}


def test_a_misspelt_option_is_refused_not_ignored():
    assert _refused_fields(save_intervall=10) == {"save_intervall"}


def test_options_are_frozen():
    options = LaunchOptions()
    with pytest.raises(ValidationError):
        options.nodes = 2  # type: ignore[misc]  # writing a frozen field is the test


def test_the_edges_of_the_port_range_are_accepted():
    assert LaunchOptions(master_port=1025).master_port == 1025
    assert LaunchOptions(master_port=65535).master_port == 65535


def test_launch_script_json_has_the_stable_keys_and_values():
    script = LaunchScript(script="#!/usr/bin/env bash\n", launcher="slurm", megatron_args=["--tp", "2"],
                          env={"NCCL_DEBUG": "WARN"}, nodes=2, gpus_per_node=8)
    assert script.to_json() == {
        "script": "#!/usr/bin/env bash\n", "launcher": "slurm", "megatron_args": ["--tp", "2"],
        "env": {"NCCL_DEBUG": "WARN"}, "nodes": 2, "gpus_per_node": 8, "files": {}, "directories": [],
        "notes": [], "megatron_release": "",
    }
