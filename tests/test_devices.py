"""Which backend a launch gets, checked before anything launches: GPUs found without
nvidia-smi, nccl refused with more ranks than GPUs, gloo on too few GPUs warned and marked,
device memory checked against the GPU, and the first node told to host the rendezvous."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from labkit import devices
from labkit.checks.config import PlacementConfig
from labkit.devices import Gpus
from labkit.errors import UsageError
from labkit.launch import LaunchOptions, launch_lab, torchrun_command
from labkit.launchspec import LaunchSpec
from labkit.results import LAUNCH_COLUMNS

from .conftest import LAUNCH_TIMEOUT_S


def test_a_driver_is_seen_without_nvidia_smi(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(devices.sys, "platform", "linux")
    monkeypatch.setattr(devices.shutil, "which", lambda name: None)
    monkeypatch.setattr(devices.glob, "glob", lambda pattern: ["/dev/nvidia0"])
    assert devices._driver_hint()  # a container with the device nodes but no tools
    monkeypatch.setattr(devices.glob, "glob", lambda pattern: [])
    assert not devices._driver_hint()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert devices._driver_hint()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # hidden on purpose
    assert not devices._driver_hint()
    monkeypatch.setattr(devices.sys, "platform", "darwin")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setattr(devices.shutil, "which", lambda name: "/usr/bin/" + name)
    assert not devices._driver_hint()  # no CUDA on macOS, whatever is on PATH


def test_the_backend_rule():
    assert devices.choose_backend(2, found=Gpus(0)) == ("gloo", False)
    assert devices.choose_backend(2, found=Gpus(2)) == ("nccl", False)
    assert devices.choose_backend(8, "gloo", found=Gpus(8)) == ("gloo", False)
    with pytest.warns(devices.GlooFallbackWarning, match="8 ranks per node but 4 GPUs"):
        assert devices.choose_backend(8, found=Gpus(4)) == ("gloo", True)
    with pytest.raises(UsageError, match="needs CUDA GPUs; this node has none"):
        devices.choose_backend(1, "nccl", found=Gpus(0))
    with pytest.raises(UsageError, match="must be gloo or nccl"):
        devices.choose_backend(1, "mpi", found=Gpus(0))


def _never_launch(monkeypatch):
    monkeypatch.setattr("labkit.launch.run_spec", lambda *a, **k: pytest.fail("launched"))


@dataclasses.dataclass(frozen=True)
class _Sized:
    """A config whose rank needs ``need`` bytes (what a lab's memory_bytes_per_rank says)."""

    need: float

    def memory_bytes_per_rank(self, world_size):
        return self.need


def test_nccl_with_more_ranks_than_gpus_is_refused_before_launch(monkeypatch):
    monkeypatch.setattr(devices, "gpus", lambda **kw: Gpus(4, (80 << 30,) * 4, "H100"))
    _never_launch(monkeypatch)
    with pytest.raises(UsageError, match="8 ranks per node need 8 GPUs, this node has 4"):
        launch_lab("placement", PlacementConfig(), LaunchOptions(nprocs=(4, 8), backend="nccl",
                                                              progress=False))


def test_a_rank_larger_than_the_gpu_is_refused_before_launch(monkeypatch):
    monkeypatch.setattr(devices, "gpus", lambda **kw: Gpus(2, (80 << 30,) * 2, "H100"))
    _never_launch(monkeypatch)
    with pytest.raises(UsageError, match="100.0 GB of device memory.*a H100 has 85.9 GB"):
        launch_lab("placement", _Sized(100e9), LaunchOptions(nprocs=(2,), progress=False))
    # on gloo the same estimate is checked against the host's memory instead
    monkeypatch.setattr(devices, "gpus", lambda **kw: Gpus(0))
    with pytest.raises(UsageError, match="this machine has .* GB available"):
        launch_lab("placement", _Sized(1e15), LaunchOptions(nprocs=(2,), progress=False))


def test_the_first_node_is_told_to_host_the_rendezvous():
    spec = dict(worker="placement", nproc=2, nnodes=2, rdzv_endpoint="10.0.0.5:29500")
    first = torchrun_command(LaunchSpec(node_rank=0, **spec), Path("/l"), Path("/o"))
    other = torchrun_command(LaunchSpec(node_rank=1, **spec), Path("/l"), Path("/o"))
    assert "--rdzv-conf=is_host=1" in first and "--rdzv-conf=is_host=0" in other
    one = torchrun_command(LaunchSpec(worker="placement", nproc=2), Path("/l"), Path("/o"))
    assert not any(a.startswith("--rdzv") for a in one)


def test_gloo_fallback_is_a_declared_launch_column():
    assert "gloo_fallback" in {c.name for c in LAUNCH_COLUMNS}


@pytest.mark.slow
def test_too_few_gpus_runs_on_gloo_with_every_row_marked(monkeypatch):
    # one GPU for two ranks: the launch goes to gloo on the CPU, says so, and marks its rows
    monkeypatch.setattr(devices, "gpus", lambda **kw: Gpus(1, (80 << 30,), "H100"))
    with pytest.warns(devices.GlooFallbackWarning):
        (res,) = launch_lab("placement", PlacementConfig(), LaunchOptions(
            nprocs=(2,), progress=False, timeout_s=LAUNCH_TIMEOUT_S))
    assert res.backend == "gloo"
    assert res.rows() and all(r["gloo_fallback"] is True for r in res.rows())
