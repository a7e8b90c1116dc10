"""suite.executors: the executor a suite runs with, built from the config's megapilot block and the cluster file."""

from __future__ import annotations

import pytest

from megapilot.execute.slurm import SlurmExecutor
from megapilot.suite.executors import (
    container_wrapper,
    executor_settings,
    make_executor,
    node_addresses,
    scheduler_options,
    ssh_nodes,
)
from tests.suite.cvs_files import two_host_suite


def test_ssh_nodes_come_from_the_cluster_file_head_node_first(tmp_path):
    suite = two_host_suite(tmp_path, "ssh")
    nodes = ssh_nodes(suite)
    assert [n.host for n in nodes] == ["10.0.0.2", "10.0.0.1"]
    assert nodes[0].reach_address == "192.168.0.2" and nodes[0].port == 2222 and nodes[0].user == "ops"
    assert nodes[0].options == ("StrictHostKeyChecking=accept-new",)
    wrapper = container_wrapper(suite)
    assert wrapper is not None and (wrapper.runtime, wrapper.mode) == ("docker", "exec")


def test_a_suite_on_fewer_nodes_than_the_cluster_file_takes_the_first(tmp_path):
    suite = two_host_suite(tmp_path, "ssh", nodes=1)
    assert [node.host for node in node_addresses(suite)] == ["10.0.0.2"]


def test_scheduler_options_are_partition_account_then_the_sbatch_options_in_order(tmp_path):
    suite = two_host_suite(tmp_path, "slurm", partition="gpu", account="proj7",
                           sbatch_options=["--qos=high", "-C a100"])
    assert scheduler_options(suite) == ["--partition=gpu", "--account=proj7", "--qos=high", "-C a100"]


def test_no_scheduler_options_unless_configured(tmp_path):
    assert scheduler_options(two_host_suite(tmp_path, "slurm")) == []


@pytest.mark.parametrize(("lease", "executor_lease_s"), [({}, 120.0), ({"job_lease_s": 45}, 45.0),
                                                          ({"job_lease_s": 0}, None)])
def test_the_slurm_executor_gets_the_suites_options_and_job_lease(tmp_path, lease, executor_lease_s):
    suite = two_host_suite(tmp_path, "slurm", partition="gpu", **lease)
    assert executor_settings(suite).scheduler_options == ("--partition=gpu",)
    executor = make_executor(suite)
    assert isinstance(executor, SlurmExecutor)
    assert executor.sbatch_options == ["--partition=gpu"] and executor.lease_s == executor_lease_s
