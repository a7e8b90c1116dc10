"""The CVS cluster file: user expansion, node order, ports, template placeholders refused."""

from __future__ import annotations

import getpass
import json
from pathlib import Path

import pytest

from megapilot.errors import MegapilotError
from megapilot.suite.cluster import load_cluster
from tests.suite.cvs_files import CVS_DIR


def _write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(data))
    return path


def test_nodes_in_file_order_with_the_head_first(tmp_path: Path) -> None:
    path = _write(tmp_path, {
        "_user_comment": "...", "username": "{user-id}", "priv_key_file": "/home/{user-id}/.ssh/id_rsa",
        "head_node_dict": {"mgmt_ip": "10.0.0.2"}, "env_vars": {"A": "1"},
        "node_dict": {"10.0.0.1": {"bmc_ip": "NA", "vpc_ip": "192.168.0.1"},
                      "10.0.0.2": {"bmc_ip": "NA", "vpc_ip": "192.168.0.2"},
                      "10.0.0.3": {"bmc_ip": "NA", "vpc_ip": "192.168.0.3", "port": 2222}},
        "orchestrator": "container",
    })
    cluster = load_cluster(path)
    user = getpass.getuser()
    nodes = cluster.nodes()
    assert [n.host for n in nodes] == ["10.0.0.2", "10.0.0.1", "10.0.0.3"]
    assert nodes[0].vpc_ip == "192.168.0.2" and nodes[0].user == user
    assert nodes[0].key_file == f"/home/{user}/.ssh/id_rsa"
    assert [n.port for n in nodes] == [22, 22, 2222]
    assert cluster.env_vars == {"A": "1"} and cluster.node_count == 3


def test_named_user_and_cluster_wide_ssh_port(tmp_path: Path) -> None:
    cluster = load_cluster(_write(tmp_path, {
        "username": "carol", "priv_key_file": "/home/{user-id}/k", "ssh_port": 2201,
        "head_node_dict": {"mgmt_ip": "127.0.0.1"}, "node_dict": {"127.0.0.1": {"bmc_ip": "NA"}}}))
    (node,) = cluster.nodes()
    assert (node.user, node.key_file, node.port, node.vpc_ip) == ("carol", "/home/carol/k", 2201, "127.0.0.1")


def test_the_real_cvs_template_is_refused_for_its_placeholder_hosts() -> None:
    with pytest.raises(MegapilotError) as info:
        load_cluster(CVS_DIR / "cluster.json")
    assert info.value.field == "cluster" and "xx.xx.xx.xx" in str(info.value)
    # the template repeats one placeholder per node: unfilled addresses, not a node listed twice (whose fix, keep
    # one entry per key, would throw the other nodes away)
    assert "still hold template placeholders" in info.value.problem
    assert info.value.fix == "replace them with the nodes' IPs or hostnames"


@pytest.mark.parametrize("data, words", [
    ({"username": "u", "head_node_dict": {"mgmt_ip": "a"}, "node_dict": {}}, "node_dict"),
    ({"username": "u", "head_node_dict": {"mgmt_ip": "z"}, "node_dict": {"a": {}}}, "not a key of node_dict"),
    ({"username": "u", "node_dict": {"a": {}}}, "head_node_dict"),
])
def test_bad_cluster_files_name_the_field(tmp_path: Path, data: dict, words: str) -> None:
    with pytest.raises(MegapilotError) as info:
        load_cluster(_write(tmp_path, data))
    assert words in str(info.value)


def test_unreadable_cluster_file(tmp_path: Path) -> None:
    (tmp_path / "cluster.json").write_text("{not json")
    with pytest.raises(MegapilotError, match="not JSON"):
        load_cluster(tmp_path / "cluster.json")


def test_a_node_listed_twice_is_refused_not_read_as_one_node(tmp_path: Path) -> None:
    text = ('{"username": "u", "head_node_dict": {"mgmt_ip": "10.0.0.1"}, "node_dict": '
            '{"10.0.0.1": {"vpc_ip": "192.168.0.1"}, "10.0.0.1": {"vpc_ip": "192.168.0.2"}}}')
    (tmp_path / "cluster.json").write_text(text)
    with pytest.raises(MegapilotError) as info:
        load_cluster(tmp_path / "cluster.json")
    assert info.value.field == "cluster" and "'10.0.0.1' appears more than once" in str(info.value)
