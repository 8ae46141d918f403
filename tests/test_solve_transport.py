"""The solve-scaling lab's messages: the shm and torch transports, the halo exchange, and the
rule that every tensor handed to torch.distributed lives on the rank's device.

Launching tests (``slow``): one 2-rank launch per transport that returns its solutions, the
device audit of the solve and transport workers, and the transport check on 2 and 3 ranks.
The halo exchange's calls are recorded in this process, without a launch.
"""

from __future__ import annotations

import json
import types
import warnings

import numpy as np
import pytest
import torch

from labkit.errors import UsageError
from labkit.launch import OversubscribedWarning
from labkit.solve import krylov
from labkit.solve.config import SolveConfig, closest_grid
from labkit.solve.operator import DistOperator
from labkit.solve.partition import make_partition
from labkit.solve.problems import global_matrix, local_system, rhs
from tests.conftest import LAUNCH_TIMEOUT_S

from ._solve_helpers import one_rank, scipy_cg


# -- launches --------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("transport", ["shm", "torch"])
def test_two_rank_solution_equals_one_rank_and_scipy(transport):
    from labkit.config import to_dict
    from labkit.launch import launch

    cfg = SolveConfig(modes=("strong",), total_dof=3000,
                      methods=("cg", "pipecg", "minres"), partitioners=("simple", "metis"),
                      warmup=0, repeat=1, keep_solution=True, transport=transport)
    dims = closest_grid(3000, 2)
    # shm needs CPU tensors: gloo even where GPUs would give nccl
    res = launch("solve", 2, to_dict(cfg), timeout_s=LAUNCH_TIMEOUT_S,
                 backend="gloo" if transport == "shm" else None)
    A = global_matrix(dims)
    b = rhs("random", dims, np.arange(A.shape[0]))
    x_scipy, scipy_its = scipy_cg(A, b)
    op, bt = one_rank(dims)
    x_one = krylov.cg(op, bt, 1e-8, 100_000).x.numpy()
    scale = np.abs(x_scipy).max()
    for key, x in res.payload["solutions"].items():
        x = np.asarray(x)
        assert np.abs(x - x_one).max() <= 1e-6 * scale, key
        assert np.abs(x - x_scipy).max() <= 1e-6 * scale, key
    for row in res.rows():
        assert row["gate_passed"] and row["world_size"] == 2 and row["transport"] == transport
        if row["method"] in ("cg", "pipecg"):
            assert abs(row["iterations"] - scipy_its) <= 0.02 * scipy_its + 1
        assert row["halo_values"] == sum(row["halo_values_per_rank"]) > 0
        assert sum(row["owned_rows_per_rank"]) == row["dof_global"]
        # device memory on GPUs only; a CPU's is the launch's RSS
        assert (row["device_memory_peak_bytes"] is None) == (row["backend"] == "gloo")


@pytest.mark.slow
@pytest.mark.parametrize("worker,cfg", [
    ("solve", SolveConfig(total_dof=600, methods=("cg", "pipecg", "pcg", "bicgstab", "gmres",
                                                  "minres"), partitioners=("simple", "metis"),
                          warmup=0, repeat=1, transport="torch", kernels="fused",
                          baseline="inline")),
    ("transport", None)], ids=["solve", "transport"])
def test_every_tensor_handed_to_torch_distributed_is_on_the_rank_device(worker, cfg, tmp_path,
                                                                        monkeypatch):
    """Under the device audit (labkit.audit: cpu:0 stands for the GPU) a host tensor handed to
    torch.distributed fails the launch, as on NCCL; the audit must have seen device tensors."""
    from labkit.checks.config import TransportCheckConfig
    from labkit.config import to_dict
    from labkit.launch import launch

    cfg = cfg or TransportCheckConfig(rounds=5, repeat=5, jitter_us=0.0)
    monkeypatch.setenv("LABKIT_DEVICE_AUDIT", "1")
    monkeypatch.setenv("LABKIT_DEVICE_AUDIT_DIR", str(tmp_path))
    # the audit runs on gloo ranks (on nccl the GPU itself is the check)
    rows = launch(worker, 2, to_dict(cfg), timeout_s=LAUNCH_TIMEOUT_S, backend="gloo").rows()
    assert rows and all(r.get("gate_passed", r.get("errors") == 0) for r in rows)
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"rank{rank}.audit.json").read_text())
        assert seen["failures"] == [] and seen["on_device"] > 0, seen


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [2, 3])
def test_shm_transport_delivers_every_message_in_order(nproc):
    """Ranks out of step by random waits, 3 ranks on 2 cores included (the polling must yield):
    every value received is the one sent, every all-reduce sums right, on both transports."""
    from labkit.checks.config import TransportCheckConfig
    from labkit.config import to_dict
    from labkit.launch import launch

    cfg = TransportCheckConfig(rounds=150, values=257, jitter_us=300.0, repeat=50)
    with warnings.catch_warnings():  # 3 ranks on 2 cores: oversubscribed on purpose
        warnings.simplefilter("ignore", OversubscribedWarning)
        rows = launch("transport", nproc, to_dict(cfg), timeout_s=LAUNCH_TIMEOUT_S).rows()
    # unset transports: every one the ranks' device supports (no shm on GPUs)
    assert [r["transport"] for r in rows] == (
        ["torch"] if rows[0]["backend"] == "nccl" else ["shm", "torch"])
    for r in rows:
        assert r["errors"] == 0 and r["rounds"] == 150, r
        assert 0 < r["exchange_time_p50_s"] < 1 and 0 < r["allreduce_time_p50_s"] < 1


# -- transports in this process --------------------------------------------------------------------
def test_transport_choice():
    from labkit.runtime import Runtime
    from labkit.solve.transport import TorchTransport, make_transport, shm_possible

    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert shm_possible(2, 1, cpu) == "ranks span several hosts"
    assert shm_possible(2, 2, cuda) == "tensors live on cuda"
    one_node_gpu = Runtime(0, 2, 0, 2, "nccl", cuda)
    assert isinstance(make_transport("auto", one_node_gpu, {}, {}), TorchTransport)
    with pytest.raises(ValueError, match="shm is not possible: tensors live on cuda"):
        make_transport("shm", one_node_gpu, {}, {})
    with pytest.raises(ValueError, match="unknown transport"):
        make_transport("mpi", one_node_gpu, {}, {})


class _Recorder:
    """Stands in for torch.distributed's point-to-point calls: records them, returns requests."""

    def __init__(self, monkeypatch, backend):
        from labkit.solve import transport

        self.calls, self.waited = [], []
        monkeypatch.setattr(transport.dist, "get_backend", lambda: backend)
        monkeypatch.setattr(transport.dist, "isend", self._call("isend", "dst"))
        monkeypatch.setattr(transport.dist, "irecv", self._call("irecv", "src"))
        monkeypatch.setattr(transport.dist, "P2POp", lambda op, t, peer: (op.kind, t, peer))
        monkeypatch.setattr(transport.dist, "batch_isend_irecv", self._batch)

    def _request(self, what):
        return types.SimpleNamespace(wait=lambda: self.waited.append(what))

    def _call(self, kind, peer_name):
        def call(tensor, **peer):
            self.calls.append((kind, tensor, peer[peer_name]))
            return self._request((kind, peer[peer_name]))
        call.kind = kind
        return call

    def _batch(self, ops):
        self.calls.append(("batch", ops))
        return [self._request((kind, peer)) for kind, _, peer in ops]


@pytest.mark.parametrize("backend,gloo_batched,batched", [
    ("nccl", False, True), ("gloo", False, False), ("gloo", True, True)])
def test_halo_exchange_is_one_batch_on_nccl_and_as_chosen_on_gloo(monkeypatch, backend,
                                                                   gloo_batched, batched):
    """nccl deadlocks on separately posted pairs: every exchange of the operator is one
    batch_isend_irecv there; gloo posts as GLOO_BATCHED says. Either way each receive lands in
    its neighbour's slice of the halo, each send carries the values that neighbour expects, and
    the requests are waited on later."""
    from labkit.solve import transport

    monkeypatch.setattr(transport, "GLOO_BATCHED", gloo_batched)
    rec = _Recorder(monkeypatch, backend)
    part = make_partition("coordinate", (12, 12), 4)
    local, (indptr, cols, vals), _ = local_system((12, 12), part, 0, "random", 0)
    assert len(local.neighbours) == 2
    op = DistOperator(local, indptr, cols, vals, world_size=4,
                      transport=transport.TorchTransport())
    x = torch.rand(op.n_ext, dtype=torch.float64)
    reqs = op.post_exchange(x)
    assert rec.waited == []  # posted, not waited: the interior rows overlap the messages
    ops = rec.calls[0][1] if batched else rec.calls
    assert len(rec.calls) == (1 if batched else 4)
    assert [(kind, peer) for kind, _, peer in ops] == (
        [("irecv", q) for q in local.neighbours] + [("isend", q) for q in local.neighbours])
    lo = op.n_owned
    for (_, t, _), count in zip(ops[:2], local.recv_counts):
        assert t.data_ptr() == x[lo:].data_ptr() and t.numel() == count  # its halo slice
        lo += count
    for _, t, q in ops[2:]:
        assert torch.equal(t, x[torch.from_numpy(local.send[q])])
    op.wait(reqs)
    assert rec.waited == [(kind, peer) for kind, _, peer in ops]


def test_shm_on_gpu_ranks_is_refused_before_launch_and_noted_where_only_ranks_know(
        monkeypatch):
    from labkit import checks, solve
    from labkit.checks.config import TransportCheckConfig
    from labkit.checks.transport_worker import transports_to_run
    from labkit.launch import LaunchOptions
    from labkit.runtime import Runtime
    from labkit.solve.transport import shm_possible

    monkeypatch.setattr("labkit.launch.choose_backend", lambda nproc, backend, **kw: ("nccl", False))
    monkeypatch.setattr("labkit.launch.run_spec", lambda *a, **k: pytest.fail("launched"))
    launch = LaunchOptions(nprocs=(2,), progress=False)
    with pytest.raises(UsageError, match="shm copies CPU memory.*use torch"):
        checks.transport_check(TransportCheckConfig(transports=("torch", "shm")), launch=launch)
    with pytest.raises(UsageError, match="shm copies CPU memory"):
        solve.run(SolveConfig(total_dof=3000, transport="shm"), launch=launch)
    TransportCheckConfig().check_backend("nccl")  # unset: the ranks pick what they can run
    SolveConfig(total_dof=3000).check_backend("nccl")  # auto: torch on GPUs
    # on the ranks: unset means what the device supports; shm asked for gets a note
    gpu = Runtime(0, 2, 0, 2, "nccl", torch.device("cuda", 0))
    cpu = Runtime(0, 2, 0, 2, "gloo", torch.device("cpu"))
    assert transports_to_run(gpu, TransportCheckConfig()) == [("torch", None)]
    assert transports_to_run(gpu, TransportCheckConfig(transports=("shm",))) == [
        ("shm", "tensors live on cuda")]
    if shm_possible(2, 2, cpu.device) is None:  # x86-64 with /dev/shm
        assert transports_to_run(cpu, TransportCheckConfig()) == [("shm", None), ("torch", None)]
