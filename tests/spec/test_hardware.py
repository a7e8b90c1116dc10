"""spec.hardware: a GPU's precisions and peaks, and a cluster built from a GPU count."""

from __future__ import annotations

import pytest

from megapilot.catalog.gpus import get_gpu
from megapilot.errors import MegapilotError
from megapilot.spec import ClusterSpec


@pytest.mark.parametrize(("gpu", "gpus", "per_node", "shape"), [
    ("h100", 64, None, (8, 8)), ("h100", 4, None, (1, 4)), ("gb200", 72, None, (18, 4)), ("h100", 12, 4, (3, 4))])
def test_a_gpu_count_fills_whole_nodes_of_the_gpus_size(gpu, gpus, per_node, shape):
    cluster = ClusterSpec.from_gpu_count(get_gpu(gpu), gpus, per_node)
    assert (cluster.num_nodes, cluster.gpus_per_node) == shape and cluster.world_size == gpus


@pytest.mark.parametrize(("gpus", "says"), [(0, "must be positive"), (12, "12 GPUs do not fill whole nodes of 8")])
def test_counts_that_fill_no_whole_nodes_are_refused_naming_gpus(gpus, says):
    with pytest.raises(MegapilotError, match=says) as caught:
        ClusterSpec.from_gpu_count(get_gpu("h100"), gpus)
    assert caught.value.field == "gpus"


def test_peaks_fall_back_to_the_bit_widths_peak_where_the_format_has_none_of_its_own():
    h100, b200 = get_gpu("h100"), get_gpu("b200")
    assert h100.peak_tflops("fp16") == h100.bf16_dense_tflops
    assert h100.peak_tflops("fp8") == h100.fp8_dense_tflops > h100.bf16_dense_tflops
    assert b200.peak_tflops("nvfp4") == (b200.nvfp4_dense_tflops or b200.fp4_dense_tflops)
    assert b200.peak_tflops("nvfp4") > b200.peak_tflops("fp8")


def test_a_precision_the_generation_lacks_is_refused_with_what_runs_instead():
    h100 = get_gpu("h100")
    h100.check_precision("fp8", "blockwise")
    with pytest.raises(MegapilotError) as caught:
        h100.check_precision("nvfp4")
    assert caught.value.field == "precision" and "fp8" in (caught.value.fix or "")
    a100 = get_gpu("a100")
    assert not a100.supports("fp8")
    with pytest.raises(MegapilotError, match="fp8 is not supported on"):
        a100.check_precision("fp8")


def test_a_cluster_far_beyond_the_largest_ever_built_is_refused_naming_gpus():
    assert ClusterSpec.from_gpu_count(get_gpu("h100"), 1_048_576).world_size == 1_048_576
    with pytest.raises(MegapilotError, match="above 1,048,576") as caught:
        ClusterSpec.from_gpu_count(get_gpu("h100"), 10_000_000)
    assert caught.value.field == "gpus" and "--gpus" in (caught.value.fix or "")
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="extra digits"):  # a cluster given by its node count, as files do
        ClusterSpec(gpu=get_gpu("h100"), num_nodes=2_000_000, gpus_per_node=8)
