"""The CPU compatibility layer rewrites what it says it rewrites, and records it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from megapilot.trainer import cpu_compat  # noqa: E402  (after the torch importorskip)
from megapilot.trainer.cpu_compat import (  # noqa: E402  (after the torch importorskip)
    REWRITES,
    CpuRngStatesTracker,
    CudaToCpuMode,
)


@pytest.fixture
def rewrites():
    before = REWRITES.counts.copy()
    yield REWRITES
    REWRITES.counts = before


def test_cuda_device_arguments_land_on_the_cpu_and_are_counted(rewrites):
    with CudaToCpuMode():
        made = torch.zeros(3, device="cuda")
        by_index = torch.empty(2, device=0)
        moved = torch.ones(2).to("cuda")
        same = moved.cuda()
    assert {made.device.type, by_index.device.type, moved.device.type} == {"cpu"}
    assert same is moved
    counted = rewrites.counts
    assert counted["device cuda→cpu in _VariableFunctionsClass.zeros"] >= 1
    assert counted["Tensor.to(cuda) → cpu"] >= 1 and counted["Tensor.cuda() → no-op"] >= 1


def test_type_query_answers_the_cuda_name_but_conversions_still_convert(rewrites):
    with CudaToCpuMode():
        tensor = torch.ones(2)
        assert tensor.type() == "torch.cuda.FloatTensor"
        assert tensor.type(torch.float64).dtype == torch.float64
    assert torch.ones(2).type() == "torch.FloatTensor"  # nothing leaks outside the mode


def test_rng_tracker_forks_reproducible_streams_and_restores_the_default(rewrites):
    tracker = CpuRngStatesTracker()
    tracker.add("model-parallel-rng", 1234)
    torch.manual_seed(7)
    default_before = torch.get_rng_state()
    with tracker.fork("model-parallel-rng"):
        first = torch.rand(4)
    assert torch.equal(torch.get_rng_state(), default_before)
    with tracker.fork("model-parallel-rng"):
        second = torch.rand(4)
    assert not torch.equal(first, second)  # the stream advanced

    replay = CpuRngStatesTracker()
    replay.add("model-parallel-rng", 1234)
    with replay.fork("model-parallel-rng"):
        assert torch.equal(torch.rand(4), first)
    with pytest.raises(Exception, match="already exists"):
        tracker.add("other", 1234)


def test_custom_backward_runs_under_the_mode(monkeypatch, rewrites):
    from torch.autograd.function import BackwardCFunction

    monkeypatch.setattr(BackwardCFunction, "apply", BackwardCFunction.apply)  # restored after the test
    installed_before = list(REWRITES.installed)
    cpu_compat._install_mode_in_backward()
    REWRITES.installed[:] = installed_before

    class AllocatesOnCudaInBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            return grad * torch.ones(grad.shape, device="cuda")  # as Megatron's all-gather backward does

    x = torch.ones(3, requires_grad=True)
    AllocatesOnCudaInBackward.apply(x).sum().backward()
    assert torch.equal(x.grad, torch.ones(3))


def test_enable_refuses_to_run_when_cuda_is_present(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(RuntimeError, match="without CUDA"):
        cpu_compat.enable_cpu_mode()


def test_distributed_optimizer_state_load_copies_values_keeps_step_and_unshares_it(rewrites):
    param = torch.nn.Parameter(torch.zeros(3))
    adam = torch.optim.Adam([param])
    shared_step = torch.tensor(5.0)
    adam.state[param] = {"step": shared_step, "exp_avg": torch.zeros(3), "exp_avg_sq": torch.zeros(3)}
    owner = SimpleNamespace(config=SimpleNamespace(use_precision_aware_optimizer_no_fp8_or_ds_fp8=False),
                            model_param_group_index_map={"w": (0, 0)}, optimizer=adam)
    loaded = {"param": torch.full((3,), 2.0), "exp_avg": torch.full((3,), 0.5), "exp_avg_sq": torch.full((3,), 0.25),
              "step": torch.tensor(0.0)}

    cpu_compat._set_main_param_and_optimizer_states_fixed(owner, "w", loaded)  # param requires grad: no error

    state = adam.state[param]
    assert torch.equal(param.detach(), loaded["param"])
    assert torch.equal(state["exp_avg"], loaded["exp_avg"]) and torch.equal(state["exp_avg_sq"], loaded["exp_avg_sq"])
    assert state["step"].item() == 5.0 and state["step"] is not shared_step


@pytest.mark.slow
def test_biased_moe_in_one_process_trains(tmp_path):
    # Tensor and expert parallel 1 with biased local experts: Megatron's in-place bias add on the one-rank
    # reduce's view fails every backward unless the reduce returns a copy.
    import os
    import subprocess
    import sys

    argv = [sys.executable, "-m", "megapilot.trainer", "--num-layers", "1", "--hidden-size", "16",
            "--num-attention-heads", "2", "--seq-length", "16", "--max-position-embeddings", "16",
            "--micro-batch-size", "1", "--global-batch-size", "2", "--train-iters", "2", "--lr", "1e-4",
            "--eval-iters", "0", "--log-interval", "1", "--mock-data", "--num-experts", "4",
            "--moe-router-topk", "2", "--moe-ffn-hidden-size", "16"]
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "one-rank expert reduce returns a copy" in done.stdout
    assert "iteration        2/       2 |" in done.stdout
