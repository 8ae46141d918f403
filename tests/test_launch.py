"""The launcher, with real ranks on gloo (the light agent on one node, torchrun across nodes):
success, failures, hangs, multi-node, no orphans."""

import contextlib
import dataclasses
import os
import socket
import sys
import threading
import time

import pytest

from labkit import agent as A
from labkit import launch as L
from labkit.errors import LaunchTimeout, RankFailed, ResultsFileError, UsageError
from labkit.procs import processes_of

from .conftest import LAUNCH_TIMEOUT_S

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("nproc", [1, 2])
def test_placement_launch_succeeds(nproc):
    res = L.launch("placement", nproc, {"allreduce_bytes": 4096, "repeat": 3},
                   timeout_s=LAUNCH_TIMEOUT_S)
    rows = res.rows()
    assert [r["rank"] for r in rows] == list(range(nproc))
    assert len({r["pid"] for r in rows}) == nproc
    assert all(r["allreduce_correct"] for r in rows)
    assert all(r["world_size"] == nproc and r["backend"] == "gloo" for r in rows)
    assert res.threads_per_rank == max(1, L.allocated_cores() // nproc)
    assert all(r["threads"] == res.threads_per_rank for r in rows)  # OMP_NUM_THREADS reached ranks
    assert set(res.logs) == set(range(nproc))


def test_a_raising_rank_is_named_within_15_s():
    t0 = time.perf_counter()
    with pytest.raises(RankFailed) as info:
        L.launch("selftest", 2, {"fault": "raise", "fault_rank": 1}, timeout_s=LAUNCH_TIMEOUT_S)
    elapsed = time.perf_counter() - t0
    err = info.value
    assert err.rank == 1 and err.exitcode == 1
    assert "rank 1 failed" in str(err) and "injected failure on rank 1" in str(err)
    assert "ChildFailedError" not in str(err).split("---")[0]  # no elastic-agent traceback up top
    assert "injected failure" in err.log_tail
    assert elapsed < 15 + 10 * (os.cpu_count() < 2)  # a launch costs ~5 s here; a failure must be named within a few more


def test_a_rank_that_exits_non_zero_is_named_not_its_victim():
    # rank 1 leaves with exit code 3; rank 0 then fails in its all-reduce (connection reset)
    with pytest.raises(RankFailed) as info:
        L.launch("selftest", 2, {"fault": "exit", "fault_rank": 1}, timeout_s=LAUNCH_TIMEOUT_S)
    assert info.value.rank == 1 and info.value.exitcode == 3
    assert "rank 1 failed (exit code 3)" in str(info.value)


def test_a_rank_killed_by_a_signal_is_named():
    with pytest.raises(RankFailed) as info:
        L.launch("selftest", 2, {"fault": "kill", "fault_rank": 1}, timeout_s=LAUNCH_TIMEOUT_S)
    assert info.value.rank == 1 and info.value.signal_name == "SIGKILL"
    assert "killed by SIGKILL" in str(info.value)


def _watch_launch_processes(stop, seen, mark):
    """Record the process groups of this test's launch (its processes inherit ``mark``)."""
    while not stop.is_set():
        for pid in processes_of(mark, "LABKIT_TEST_MARK"):
            if pid != os.getpid():
                with contextlib.suppress(ProcessLookupError):
                    seen.add(os.getpgid(pid))
        time.sleep(0.2)


def _group_alive(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def test_a_hang_is_killed_at_the_timeout_and_nothing_survives(monkeypatch):
    import uuid

    mark = uuid.uuid4().hex
    monkeypatch.setenv("LABKIT_TEST_MARK", mark)  # other launches may run beside this test
    stop, seen = threading.Event(), set()
    watcher = threading.Thread(target=_watch_launch_processes,
                               args=(stop, seen, mark))
    watcher.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(LaunchTimeout, match="timeout of 15 s"):
            L.launch("selftest", 2, {"fault": "hang", "fault_rank": 1}, timeout_s=15)
    finally:
        stop.set()
        watcher.join()
    assert time.perf_counter() - t0 < 15 + 20
    # torchrun's group and each rank's own session were all seen, and none is left
    assert len(seen) >= 3, seen
    assert not [g for g in seen if _group_alive(g)]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_agents_form_one_world_of_two_nodes():
    port, out = _free_port(), {}

    def agent(node_rank):
        try:
            out[node_rank] = L.launch("placement", 1, {"repeat": 2}, timeout_s=LAUNCH_TIMEOUT_S,
                                      nnodes=2, node_rank=node_rank,
                                      rdzv_endpoint=f"127.0.0.1:{port}", rdzv_id="test-2x1")
        except Exception as e:  # noqa: BLE001 - reported below
            out[node_rank] = e

    threads = [threading.Thread(target=agent, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(isinstance(r, L.LaunchResult) for r in out.values()), out
    payloads = [r.payload for r in out.values() if r.payload]
    assert len(payloads) == 1  # exactly one node hosted global rank 0
    rows = payloads[0]["rows"]
    assert [r["rank"] for r in rows] == [0, 1]
    assert {r["local_rank"] for r in rows} == {0}
    assert all(r.world_size == 2 for r in out.values())


def test_oversubscription_is_marked_and_warned():
    with pytest.warns(L.OversubscribedWarning):
        res = L.launch("selftest", 2, {}, threads_per_rank=L.allocated_cores(),
                       timeout_s=LAUNCH_TIMEOUT_S)
    assert res.oversubscribed and all(r["oversubscribed"] for r in res.rows())


@pytest.mark.parametrize("kwargs, match", [
    ({"worker": "nope", "nproc": 1}, "unknown worker"),
    ({"worker": "_harness", "nproc": 1}, "unknown worker"),
    ({"worker": "placement", "nproc": 0}, "nproc"),
    ({"worker": "placement", "nproc": 1, "timeout_s": 0}, "timeout"),
    ({"worker": "placement", "nproc": 1, "timeout_s": -3}, "timeout"),
    ({"worker": "placement", "nproc": 1, "nnodes": 2}, "rdzv_endpoint"),
    ({"worker": "placement", "nproc": 1, "backend": "mpi"}, "backend"),
])
def test_bad_launch_specs_are_refused_before_launching(kwargs, match):
    with pytest.raises(UsageError, match=match):
        L.LaunchSpec(**kwargs)


@dataclasses.dataclass(frozen=True)
class _OneRankOnly:
    def check_world_size(self, n):
        if n != 1:
            raise UsageError(f"world size {n} is not allowed here")


def test_a_sweep_is_checked_whole_before_its_first_launch(monkeypatch, tmp_path):
    started = []
    monkeypatch.setattr(L, "run_spec", lambda spec, **kw: started.append(spec))
    with pytest.raises(UsageError, match="ranks per node"):
        L.LaunchOptions(nprocs=(1, 0))
    with pytest.raises(UsageError, match="world size 2 is not allowed"):
        L.launch_lab("selftest", _OneRankOnly(), L.LaunchOptions(nprocs=(1, 2), progress=False))
    with pytest.raises(ResultsFileError, match="is a directory"):
        L.launch_lab("selftest", _OneRankOnly(), L.LaunchOptions(nprocs=1, progress=False),
                     store=tmp_path)
    assert started == []  # nothing was launched


@dataclasses.dataclass(frozen=True)
class _Empty:
    """A config with no fields, for launches that never start."""


def test_a_sweep_too_large_for_the_gpus_runs_every_launch_on_gloo(monkeypatch):
    """One GPU, launches of 1 and 2 ranks: the 1-rank launch would run on the GPU and the
    2-rank one on gloo on the CPU, so both run on gloo (its world sizes compare like for like),
    warned once, every launch marked gloo_fallback; with two GPUs each keeps its own."""
    from labkit import devices

    started = []

    def fake_run(spec, **kw):
        started.append(spec)
        return L.LaunchResult(spec=spec, backend=spec.backend or "nccl", threads_per_rank=1,
                              oversubscribed=False, payload=None, logs={}, wall_time_s=0.0,
                              command=())

    monkeypatch.setattr(L, "run_spec", fake_run)
    monkeypatch.setattr(devices, "gpus", lambda **kw: devices.Gpus(1))
    with pytest.warns(devices.GlooFallbackWarning, match="every launch of this sweep"):
        got = L.launch_lab("selftest", _Empty(), L.LaunchOptions(nprocs=(1, 2), progress=False))
    assert [s.backend for s in started] == ["gloo", "gloo"]
    assert [r.gloo_fallback for r in got] == [True, True]
    started.clear()
    monkeypatch.setattr(devices, "gpus", lambda **kw: devices.Gpus(2))
    got = L.launch_lab("selftest", _Empty(), L.LaunchOptions(nprocs=(1, 2), progress=False))
    assert [s.backend for s in started] == [None, None]
    assert [r.gloo_fallback for r in got] == [False, False]


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_ctrl_c_or_sigterm_kills_the_whole_launch(signame):
    """SIGINT (Ctrl-C) or SIGTERM (`timeout`, a batch system) to the host process must take every
    rank down with it."""
    import signal
    import subprocess
    import sys
    import uuid

    mark = uuid.uuid4().hex
    # SIGUSR1 makes the host print every thread's stack: the failure message shows where it hung
    code = ("import faulthandler, signal\n"
            "faulthandler.register(signal.SIGUSR1, all_threads=True)\n"
            "from labkit.launch import launch\n"
            "launch('selftest', 2, {'fault': 'hang', 'fault_rank': 1}, timeout_s=300)\n")
    env = {**os.environ, "LABKIT_TEST_MARK": mark}
    # A background job of a non-interactive shell (`bash .ci/run &`) starts with SIGINT ignored,
    # and Python then installs no KeyboardInterrupt handler: Ctrl-C could not reach the host at
    # all. Give the host the default disposition a terminal would.
    host = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))

    def marked():
        return [p for p in processes_of(mark, "LABKIT_TEST_MARK") if p != host.pid]

    deadline = time.time() + 120
    while len(marked()) < 3 and time.time() < deadline:  # torchrun + 2 ranks
        time.sleep(0.5)
    time.sleep(3)  # let the ranks reach the hanging all-reduce
    host.send_signal(getattr(signal, signame))
    try:
        _, err = host.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        host.send_signal(signal.SIGUSR1)
        time.sleep(2)
        host.kill()
        _, err = host.communicate()
        pytest.fail(f"the host did not exit within 60 s of {signame}; its threads:\n"
                    + err.decode(errors="replace")[-6000:])
    assert host.returncode != 0
    assert (b"KeyboardInterrupt" if signame == "SIGINT" else b"Terminated: received SIGTERM") in err
    deadline = time.time() + 10
    while marked() and time.time() < deadline:
        time.sleep(0.2)
    assert marked() == []


def test_step_time_is_the_slowest_ranks():
    res = L.launch("selftest", 2, {"step_sleep_s": [0.02, 0.15], "steps": 4},
                   timeout_s=LAUNCH_TIMEOUT_S)
    row = res.rows()[0]
    assert row["rank_sum"] == 1.0
    # the mean over ranks would be ~0.085 s; the slowest rank sets the pace
    assert 0.15 <= row["step_time_min_s"] <= row["step_time_p50_s"] <= row["step_time_p95_s"] < 0.5
    assert row["step_time_count"] == 4


@pytest.mark.parametrize("argv,agent", [
    (["--nproc-per-node=2", "--standalone", "--log-dir=/tmp/x", "--redirects=3",
      "--max-restarts=0", "-m", "labkit.checks.selftest_worker", "--out", "o.json"], "light"),
    (["--nproc-per-node=2", "--nnodes=2", "--node-rank=0", "--rdzv-backend=c10d",
      "--rdzv-endpoint=h:1", "--rdzv-id=x", "--log-dir=/tmp/x", "-m", "m"], "torchrun"),
    (["--nproc-per-node", "2", "--standalone", "-m", "m"], "torchrun"),  # typed by hand
    (["--standalone", "--nproc-per-node=2", "-m", "m"], "torchrun"),  # no --log-dir (README's)
    (["--standalone", "--nproc-per-node=2", "script.py"], "torchrun"),  # a script, not -m
])
def test_python_m_labkit_launch_picks_its_agent(monkeypatch, argv, agent):
    """One node in the launcher's own form: the light agent (no torch import); every other
    form, and LABKIT_AGENT=torchrun, torchrun's main."""
    seen = []
    monkeypatch.setattr(A, "torchrun_main", lambda a: seen.append(("torchrun", a)) or sys.exit(0))
    monkeypatch.setattr(A, "light_agent",
                        lambda n, d, args: seen.append(("light", n, str(d), args)) or 0)
    monkeypatch.delenv("LABKIT_AGENT", raising=False)
    with pytest.raises(SystemExit):
        A.agent_main(argv)
    assert seen[0][0] == agent
    if agent == "light":
        assert seen[0][1:] == (2, "/tmp/x", ["labkit.checks.selftest_worker", "--out", "o.json"])
        monkeypatch.setenv("LABKIT_AGENT", "torchrun")
        with pytest.raises(SystemExit):
            A.agent_main(argv)
        assert seen[1][0] == "torchrun"


def test_a_rank_waits_for_the_store_of_rank_0_instead_of_backing_off():
    """A rank that arrives before rank 0 opens the rendezvous store joins as soon as it opens
    (torch's own retry would add 0.35-0.6 s), and one whose rank 0 never comes says so."""
    from labkit.runtime import wait_for_store

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = socket.socket()

    def open_late():
        time.sleep(0.15)
        server.bind(("127.0.0.1", port))
        server.listen()

    opener = threading.Thread(target=open_late)
    opener.start()
    try:
        waited = wait_for_store("127.0.0.1", port, timeout_s=10, rank=1)
    finally:
        opener.join()
        server.close()
    assert waited >= 0.1  # it waited for the store, then joined
    with pytest.raises(RuntimeError, match=r"rank 1: no rendezvous store at 127.0.0.1:\d+ after "
                                            r"0.05 s \(rank 0 never opened it\)"):
        wait_for_store("127.0.0.1", port, timeout_s=0.05, rank=1)
