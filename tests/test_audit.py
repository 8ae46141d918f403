"""The device audit (labkit.audit): its tagging rules on one process, wrong computations it
must reject, and every worker launched under it on two ranks."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from labkit import audit
from labkit.launch import WORKERS, launch

from .audit_configs import MIN_RANKS, config
from .conftest import LAUNCH_TIMEOUT_S

D = torch.device("cpu", 0)  # what runtime.init declares under the audit
HERE = "tests/test_audit.py"
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def audited():
    """The audit on in this process (rank 0), off again after the test."""
    a = audit.install(D, rank=0, local_rank=0)
    try:
        yield a
    finally:
        audit.uninstall()


def _line() -> int:
    """The line of the caller (for the audit's "at FILE:LINE")."""
    return inspect.currentframe().f_back.f_lineno


def test_enabled_reads_the_environment(monkeypatch):
    monkeypatch.delenv(audit.ENV, raising=False)
    assert not audit.enabled()
    monkeypatch.setenv(audit.ENV, "0")
    assert not audit.enabled()
    monkeypatch.setenv(audit.ENV, "1")
    assert audit.enabled()


@pytest.mark.parametrize("make, tag", [
    (lambda: torch.zeros(3), audit.HOST),
    (lambda: torch.tensor([1.0, 2.0]), audit.HOST),
    (lambda: torch.as_tensor(np.ones(2)), audit.HOST),
    (lambda: torch.from_numpy(np.ones(2)), audit.HOST),
    (lambda: torch.zeros(3, device="cpu"), audit.HOST),
    (lambda: torch.zeros(3, device=torch.device("cpu")), audit.HOST),
    (lambda: torch.ones(3, device=D).cpu(), audit.HOST),
    (lambda: torch.ones(3, device=D).to("cpu"), audit.HOST),
    (lambda: torch.zeros(3, device=D), audit.DEVICE),
    (lambda: torch.zeros(3, device="cpu:0"), audit.DEVICE),
    (lambda: torch.tensor([1.0], device=D), audit.DEVICE),
    (lambda: torch.as_tensor(np.ones(2), device=D), audit.DEVICE),
    (lambda: torch.ones(3).to(D), audit.DEVICE),
    (lambda: torch.ones(3).to(device="cpu:0"), audit.DEVICE),
    (lambda: torch.ones(3).to(torch.zeros(1, device=D)), audit.DEVICE),
    (lambda: torch.ones(3).to(torch.zeros(1)), audit.HOST),
    (lambda: torch.ones(3).cuda(), audit.DEVICE),
    (lambda: torch.ones(3).to(D).double(), audit.DEVICE),
    (lambda: torch.empty(2, device=torch.zeros(1, device=D).device), audit.DEVICE),
    (lambda: torch.zeros_like(torch.zeros(2, device=D)), audit.DEVICE),
    (lambda: torch.ones(2, device=D).new_zeros(3), audit.DEVICE),
])
def test_tensors_are_tagged_where_they_were_made_or_moved(audited, make, tag):
    assert audited.tag_of(make()) == tag


def test_a_move_copies_and_the_source_stays_where_it_was(audited):
    x = torch.ones(4)
    y = x.to(D)  # the same device to torch: without the audit's copy y would be x
    assert y.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    assert (audited.tag_of(x), audited.tag_of(y)) == (audit.HOST, audit.DEVICE)
    z = y.cpu()
    assert (audited.tag_of(y), audited.tag_of(z)) == (audit.DEVICE, audit.HOST)
    assert y.device == D and z.device == torch.device("cpu")  # what .device says on a GPU


def test_results_take_their_inputs_tag(audited):
    on, host = torch.ones(3, device=D), torch.ones(3)
    assert audited.tag_of(on * 2 + on) == audit.DEVICE
    assert audited.tag_of(host @ host.unsqueeze(1)) == audit.HOST
    assert audited.tag_of(on * torch.tensor(2.0)) == audit.DEVICE  # a 0-d host tensor: a scalar
    assert audited.tag_of(on[1:]) == audit.DEVICE
    assert audited.tag_of(torch.cat([on, on])) == audit.DEVICE
    target = torch.empty(3, device=D)
    target.copy_(host)  # a host-to-device copy is legal; the target stays on the device
    assert audited.tag_of(target) == audit.DEVICE
    assert audited.tag_of(on[torch.tensor([0, 2])]) == audit.DEVICE  # a host index, as on CUDA


def test_a_model_moved_to_the_device_and_its_gradients(audited):
    model = torch.nn.Linear(4, 2)
    assert audited.tag_of(model.weight) == audit.HOST
    model.to(D)
    assert audited.tag_of(model.weight) == audit.DEVICE and model.weight.device == D
    model(torch.ones(3, 4, device=D)).sum().backward()  # autograd makes the gradients in C++
    assert audited.tag_of(model.weight.grad) == audit.DEVICE
    assert audited.summary()["ops_on_device"] > 0


def test_tensors_it_never_saw_made_are_unknown_and_pass(audited):
    audit.uninstall()
    before = torch.ones(3)  # made while no audit ran
    a = audit.install(D, rank=0, local_rank=0)
    assert a.tag_of(before) is None
    a.check("dist.all_reduce", [("", before)])
    assert (a.summary()["unknown"], a.summary()["on_device"]) == (1, 0)


def test_mixing_a_host_and_a_device_tensor_fails(audited):
    on, host = torch.ones(3, device=D), torch.ones(3)
    with pytest.raises(audit.DeviceAuditError) as err:
        line = _line() + 1
        on + host
    assert str(err.value) == (
        "device audit: rank 0 mixed a host tensor (shape (3,), torch.float32) with a device "
        f"tensor (shape (3,), torch.float32) in torch.Tensor.add at {HERE}:{line} (the first "
        "frame outside torch); on CUDA this raises: the tensors of one operation live on one "
        "device (cpu:0 here stands for cuda:0)")
    assert audited.summary()["failures"] == [str(err.value)]


def test_a_model_left_on_the_host_fed_device_inputs_fails(audited):
    model = torch.nn.Linear(4, 2)  # the lab forgot .to(rt.device)
    x = torch.ones(3, 4, device=D)
    with pytest.raises(audit.DeviceAuditError, match=r"mixed a host tensor \(shape \(2, 4\), "
                       r"torch.float32\) with a device tensor \(shape \(3, 4\), torch.float32\) "
                       f"in torch.nn.functional.linear at {HERE}:"):
        model(x)  # the frame that called into torch, past Module.__call__ and Linear.forward
    with pytest.raises(audit.DeviceAuditError, match=f"in torch.nn.functional.linear at {HERE}"):
        F.linear(x, model.weight)


@pytest.mark.parametrize("name, call, shape", [
    ("all_reduce", lambda: dist.all_reduce(torch.ones(3)), (3,)),
    ("broadcast", lambda: dist.broadcast(torch.ones(2, 2), src=0), (2, 2)),
    ("all_gather", lambda: dist.all_gather([torch.empty(2, device=D)], torch.ones(2)), (2,)),
    ("all_gather_into_tensor",
     lambda: dist.all_gather_into_tensor(torch.empty(4), torch.ones(2, device=D)), (4,)),
    ("reduce_scatter_tensor",
     lambda: dist.reduce_scatter_tensor(torch.empty(2, device=D), torch.ones(4)), (4,)),
    ("all_to_all_single",
     lambda: dist.all_to_all_single(torch.empty(2, device=D), torch.ones(2)), (2,)),
    ("send", lambda: dist.send(torch.ones(5), dst=1), (5,)),
    ("irecv", lambda: dist.irecv(torch.empty(5), src=1), (5,)),
])
def test_a_host_tensor_handed_to_torch_distributed_fails(audited, name, call, shape):
    """The check runs before torch: no process group needed to see it refuse."""
    with pytest.raises(audit.DeviceAuditError) as err:
        call()
    assert str(err.value).startswith(
        f"device audit: rank 0 passed a host tensor (shape {shape}, torch.float32) to "
        f"dist.{name} at {HERE}:")
    assert str(err.value).endswith(
        "(the first frame outside torch); every tensor handed to torch.distributed must live "
        "on the rank's device (cpu:0 here stands for cuda:0)")
    assert audited.summary()["calls"] == 1


def test_uninstall_puts_torch_back():
    originals = {n: getattr(dist, n) for n in ("all_reduce", "batch_isend_irecv")}
    audit.install(D, rank=0, local_rank=0)
    assert dist.all_reduce is not originals["all_reduce"]
    audit.uninstall()
    assert {n: getattr(dist, n) for n in originals} == originals
    assert audit.summary() is None
    with pytest.raises((ValueError, RuntimeError), match="process group"):
        dist.all_reduce(torch.ones(3))  # torch's own refusal: no audit in the way


# -- one real rank: runtime.init under the audit ---------------------------------------------
def _rank(tmp_path: Path, code: str) -> subprocess.CompletedProcess:
    """Run ``code`` as a plain process (a world of one) with the audit on."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                        "MASTER_PORT")}
    env.update({audit.ENV: "1", audit.DIR_ENV: str(tmp_path), "LABKIT_STATUS_DIR": str(tmp_path),
                "LABKIT_BACKEND": "gloo", "PYTHONPATH": str(REPO)})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=120)


def test_a_rank_of_a_world_of_one_is_audited(tmp_path):
    p = _rank(tmp_path, """
        import torch, torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        from labkit import audit, runtime

        rt = runtime.init()
        print("device", rt.device)
        t = torch.ones(3, device=rt.device)
        dist.all_reduce(t)
        box = [None]
        dist.all_gather_object(box, {"x": torch.ones(2)})  # torch picks its tensors' device
        DDP(torch.nn.Linear(2, 2).to(rt.device))
        for wrong in (lambda: dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.ones(2), 0)]),
                      lambda: DDP(torch.nn.Linear(2, 2))):
            try:
                wrong()
            except audit.DeviceAuditError as e:
                print(e)
        runtime.finalize()
    """)
    assert p.returncode == 0, p.stderr
    out = p.stdout.splitlines()
    assert out[0] == "device cpu:0"
    assert out[1].startswith("device audit: rank 0 passed a host tensor (isend to rank 0, "
                             "shape (2,), torch.float32) to dist.batch_isend_irecv at <string>:")
    assert out[2].startswith("device audit: rank 0 passed a host tensor (weight, shape (2, 2), "
                             "torch.float32) to DistributedDataParallel at <string>:")
    summary = json.loads((tmp_path / "rank0.audit.json").read_text())  # written at finalize
    assert summary["failures"] == out[1:3]
    assert summary["calls"] == 4  # all_reduce, DDP twice, the batch; not the object collective
    assert summary["on_device"] == 1 + 2  # the all-reduced tensor, the first DDP's parameters


def test_a_rank_that_hands_a_host_tensor_to_a_collective_fails(tmp_path):
    p = _rank(tmp_path, """
        import torch, torch.distributed as dist
        from labkit.harness import worker_main

        def on_rank(rt, cfg):
            loss = torch.tensor([0.5])  # wrong: made on the host
            dist.all_reduce(loss)
            return {"rows": []}

        worker_main(on_rank, argv=[])
    """)
    assert p.returncode == 1
    error = json.loads((tmp_path / "rank0.error").read_text())["error"]
    assert error.startswith("DeviceAuditError: device audit: rank 0 passed a host tensor "
                            "(shape (1,), torch.float32) to dist.all_reduce at <string>:7 ")
    assert json.loads((tmp_path / "rank0.audit.json").read_text())["failures"]


# -- every worker, two ranks ------------------------------------------------------------------
#: the operation that does a lab's main work: it must run on the device (a lab whose matrices
#: stay on the host hands torch.distributed nothing wrong, yet would time the CPU on a GPU)
MAIN_WORK = {"workshare": "mm", "pipeline": "linear", "ddp": "linear", "tp": "linear",
             "fsdp": "linear", "machine": "mm", "moe": "mm",
             "cp": "__matmul__"}


def test_every_worker_has_a_small_config():
    """The small configs are ones each worker's own config class accepts, at 1, 2 and 8 ranks
    (the GPU tests launch as many ranks as there are GPUs)."""
    from labkit.checks.config import PlacementConfig, SelftestConfig, TransportCheckConfig
    from labkit.collectives.config import CollectivesConfig
    from labkit.config import from_dict
    from labkit.cp.config import CPConfig
    from labkit.ddp.config import DDPConfig
    from labkit.fsdp.config import FSDPConfig
    from labkit.machine.config import MachineConfig
    from labkit.moe.config import MoEConfig
    from labkit.pipeline.config import PipelineConfig
    from labkit.solve.config import SolveConfig
    from labkit.speedup.config import WorkshareConfig
    from labkit.tp.config import TPConfig

    classes = {"solve": SolveConfig, "collectives": CollectivesConfig, "pipeline": PipelineConfig,
               "ddp": DDPConfig, "tp": TPConfig, "fsdp": FSDPConfig, "workshare": WorkshareConfig,
               "placement": PlacementConfig, "transport": TransportCheckConfig,
               "selftest": SelftestConfig, "machine": MachineConfig, "moe": MoEConfig,
               "cp": CPConfig}
    assert set(classes) == set(WORKERS) and set(MAIN_WORK) <= set(WORKERS)
    for worker, cls in classes.items():
        for n in (1, 2, 8):
            cfg = from_dict(cls, config(worker, n))
            if n >= MIN_RANKS.get(worker, 1) and hasattr(cfg, "check_world_size"):
                cfg.check_world_size(n)


@pytest.mark.slow
@pytest.mark.parametrize("worker", sorted(WORKERS))
def test_every_worker_passes_the_audit_on_two_ranks(worker, tmp_path, monkeypatch):
    """Two ranks under the audit: no failure, and the audit saw device tensors handed to
    torch.distributed (it cannot pass by seeing nothing)."""
    monkeypatch.setenv(audit.ENV, "1")
    monkeypatch.setenv(audit.DIR_ENV, str(tmp_path))
    res = launch(worker, 2, config(worker, 2), timeout_s=LAUNCH_TIMEOUT_S)
    assert res.backend == "gloo" and res.payload["meta"]["device"] == "cpu:0"
    assert res.rows()
    for rank in (0, 1):
        s = json.loads((tmp_path / f"rank{rank}.audit.json").read_text())
        assert s["failures"] == [], s["failures"]
        assert s["calls"] > 0 and s["tensors"] > 0 and s["on_device"] > 0, s
        assert s["ops_on_device"] > 0, s
        if worker in MAIN_WORK:
            assert MAIN_WORK[worker] not in s["host_ops"], s["host_ops"]
