"""The input bounds several layers share: the cluster's and the saved profile's agree, and reading the history
stays free of the spec package the bound would otherwise come from."""

from __future__ import annotations

import pytest

from megapilot.catalog.gpus import get_gpu
from megapilot.errors import MegapilotError
from megapilot.limits import MAX_GPUS, MAX_GPUS_REASON
from megapilot.spec import ClusterSpec
from megapilot.store.profile import Profile


def test_a_cluster_and_a_profile_take_the_same_largest_gpu_count():
    assert ClusterSpec.from_gpu_count(get_gpu("h100"), MAX_GPUS).world_size == MAX_GPUS
    assert Profile(gpus=MAX_GPUS).gpus == MAX_GPUS
    with pytest.raises(MegapilotError, match=MAX_GPUS_REASON):
        ClusterSpec.from_gpu_count(get_gpu("h100"), MAX_GPUS + 8)
    with pytest.raises(ValueError):
        Profile(gpus=MAX_GPUS + 8)


def test_the_limits_module_imports_nothing():
    """It sits below every package (tests/test_architecture.py PACKAGE_ORDER): an import would pull one in."""
    import ast
    from pathlib import Path

    import megapilot.limits

    tree = ast.parse(Path(megapilot.limits.__file__).read_text())
    assert not [node for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)]
