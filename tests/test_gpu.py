"""Every lab's worker on every GPU of the machine (one rank per GPU, nccl), small configs
(tests/audit_configs.py): the lab's own correctness fields, the rows' device, the device
memory columns. Skipped without CUDA (conftest); the CPU stand-in is tests/test_audit.py.

The lab-level GPU tests of ddp, tp and fsdp (in their own test files) run each lab's ``run``
on up to two GPUs; these launch the workers themselves on all of them."""

from __future__ import annotations

import pytest

from labkit.launch import launch

from .audit_configs import MIN_RANKS, config
from .conftest import LAUNCH_TIMEOUT_S

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def _gpus() -> int:
    import torch

    return torch.cuda.device_count()


def _launch(worker: str):
    """``worker`` on one rank per GPU, nccl: (its rows, the number of ranks)."""
    n = _gpus()
    if n < MIN_RANKS.get(worker, 1):
        pytest.skip(f"{worker} needs {MIN_RANKS[worker]} ranks, one per GPU; this machine "
                    f"has {n} GPU")
    res = launch(worker, n, config(worker, n), backend="nccl", timeout_s=LAUNCH_TIMEOUT_S)
    assert res.backend == "nccl"
    assert [p["device"] for p in res.placement] == [f"cuda:{i}" for i in range(n)]
    assert all(p["problem"] == "" for p in res.placement)
    rows = res.rows()
    assert rows and all(r["device"].startswith("cuda") for r in rows)
    return rows, n


def _device_memory(rows) -> None:
    """Where the lab reports the device memory a rank held, it is there and positive."""
    for r in rows:
        if "device_memory_peak_bytes" in r:
            assert r["device_memory_peak_bytes"] > 0, r


def test_solve():
    rows, n = _launch("solve")
    assert {r["method"] for r in rows} == {"cg", "pipecg"}
    for r in rows:
        assert r["gate_passed"] and r["world_size"] == n, r
        assert r["transport"] == ("torch" if n > 1 else None), r  # one rank sends nothing
    _device_memory(rows)


def test_collectives():
    rows, n = _launch("collectives")
    assert {r["op"] for r in rows} == set(config("collectives", n)["ops"])
    assert all(r["wrong"] == 0 and r["time_p50_s"] > 0 for r in rows)
    _device_memory(rows)


def test_pipeline():
    rows, n = _launch("pipeline")
    assert {r["schedule"] for r in rows} == {"naive_gpipe", "gpipe", "1f1b"}
    for r in rows:
        assert r["matches_single_process"] and r["num_stages"] == n, r
        assert 0 <= r["bubble_measured"] < 1
    _device_memory(rows)


def test_ddp():
    rows, n = _launch("ddp")
    ddp = [r for r in rows if r["variant"] == "ddp"]
    assert ddp and all(r["replicas_in_sync"] and r["world_size"] == n for r in ddp)
    _device_memory(rows)


def test_tp():
    rows, n = _launch("tp")
    assert {r["variant"] for r in rows} >= {"naive", "library"}
    assert all(r["matches_single_process"] and r["world_size"] == n for r in rows)
    _device_memory(rows)


def test_fsdp():
    rows, n = _launch("fsdp")
    assert {r["variant"] for r in rows} >= {"ddp", "zero1", "fsdp"}
    assert all(r["matches_single_process"] and r["world_size"] == n for r in rows)
    _device_memory(rows)


def test_placement():
    rows, n = _launch("placement")
    assert [r["device"] for r in rows] == [f"cuda:{i}" for i in range(n)]
    assert all(r["allreduce_correct"] and r["problem"] == "" for r in rows)


def test_transport_check():
    rows, _ = _launch("transport")
    assert [r["transport"] for r in rows] == ["torch"]
    assert all(r["errors"] == 0 and r["rounds"] == 5 for r in rows)


def test_workshare():
    rows, _ = _launch("workshare")
    (row,) = rows
    assert row["time_s"] > 0 and row["serial_products"] == 2
    _device_memory(rows)
