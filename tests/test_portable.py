"""labkit's process layer where the Linux-only facts are missing (macOS, a normal user): the
facts psutil withholds count as unknown, never as "dead"; a real launch runs, its heartbeat keeps
its ranks alive, killing its host leaves nothing behind, and its memory check works, with labkit
barred from /proc, no affinity masks and no parent-death signal (tests/_no_proc.py)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import psutil
import pytest

from labkit import launch as L
from labkit import orphans, procs
from labkit.errors import UsageError

from ._no_proc import sitecustomize

ROOT = Path(__file__).resolve().parent.parent


def _denied(*args, **kwargs):
    raise psutil.AccessDenied(os.getpid())


# -- a fact withheld is unknown, not "dead" -------------------------------------------------------
def test_a_process_whose_facts_are_withheld_counts_as_alive(monkeypatch):
    me, start = os.getpid(), procs.process_start(os.getpid())
    monkeypatch.setattr(psutil.Process, "status", _denied)
    monkeypatch.setattr(psutil.Process, "create_time", _denied)
    assert procs.alive(me, start) and procs.alive(me)
    assert procs.process_start(me) is None
    assert not procs.alive(2**31)  # no such process: that is proof


def test_a_reused_pid_or_a_zombie_is_not_the_launcher(monkeypatch):
    me = os.getpid()
    assert not procs.alive(me, f"{float(procs.process_start(me)) - 60:.3f}")
    assert procs.alive(me, "not-a-time")  # a token that cannot be read: the pid alone decides
    monkeypatch.setattr(psutil.Process, "status", lambda self: psutil.STATUS_ZOMBIE)
    assert not procs.alive(me)


def test_processes_whose_environment_is_withheld_are_skipped(monkeypatch):
    mine = types.SimpleNamespace(pid=11, environ=lambda: {"MARK": "x"})
    others = [types.SimpleNamespace(pid=pid, environ=lambda e=e: (_ for _ in ()).throw(e))
              for pid, e in ((12, psutil.AccessDenied(12)), (13, psutil.NoSuchProcess(13)),
                             (14, psutil.ZombieProcess(14)))]
    unmarked = types.SimpleNamespace(pid=15, environ=lambda: {"MARK": "y"})
    monkeypatch.setattr(psutil, "process_iter", lambda: iter([*others, mine, unmarked]))
    assert procs.processes_of("x", "MARK") == [11]


def test_descendants_of_a_process_that_cannot_be_read_are_none(monkeypatch):
    monkeypatch.setattr(psutil.Process, "children", _denied)
    assert procs.descendants(os.getpid()) == {}
    assert procs.descendants(2**31) == {}


def test_cores_without_an_affinity_mask(monkeypatch):
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    if hasattr(psutil.Process, "cpu_affinity"):
        monkeypatch.setattr(psutil.Process, "cpu_affinity", _denied)
        assert procs.available_cores() == psutil.cpu_count(logical=True)
        monkeypatch.delattr(psutil.Process, "cpu_affinity")
    assert procs.available_cores() == psutil.cpu_count(logical=True) >= 1
    monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: None)  # not even a count
    assert procs.available_cores() == (os.cpu_count() or 1)
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "1")
    assert procs.allocated_cores() == 1


def test_ranks_bind_to_their_share_of_the_cores_where_the_platform_can(monkeypatch):
    """Binding goes through psutil's affinity (Linux, Windows); without one (macOS), with
    fewer cores than local ranks, or switched off, the operating system keeps the choice."""
    calls = []

    class FakeProcess:
        def cpu_affinity(self, cores=None):
            if cores is None:
                return [0, 1, 2, 3, 4, 5]
            calls.append(list(cores))

    monkeypatch.setattr(psutil, "Process", FakeProcess)
    assert procs.bind_to_cores(1, 3) == [2, 3] and calls == [[2, 3]]
    assert procs.bind_to_cores(0, 4) == [0]  # six cores, four ranks: one each, two left over
    assert procs.bind_to_cores(0, 8) is None  # oversubscribed: the scheduler places them
    monkeypatch.setenv("LABKIT_BIND_CORES", "0")
    assert procs.bind_to_cores(0, 2) is None
    monkeypatch.delenv("LABKIT_BIND_CORES")
    monkeypatch.setattr(FakeProcess, "cpu_affinity", _denied)
    assert procs.bind_to_cores(0, 2) is None and procs.bound_cores() is None
    monkeypatch.delattr(FakeProcess, "cpu_affinity")  # macOS: no affinity mask at all
    assert procs.bind_to_cores(0, 2) is None and procs.bound_cores() is None


@pytest.mark.skipif(not hasattr(psutil.Process, "cpu_affinity") or psutil.cpu_count() < 2,
                    reason="needs an affinity mask and 2 cores")
def test_two_ranks_run_on_cores_of_their_own(tmp_path):
    """A real 2-rank launch: each rank's placement row names its own core."""
    res = L.launch("placement", 2, {"allreduce_bytes": 1024, "repeat": 1, "warmup": 0},
                   timeout_s=120)
    cores = [tuple(r["bound_cores"]) for r in res.rows()]
    assert len(cores) == 2 and not set(cores[0]) & set(cores[1]), cores
    # "cores" is the provenance's count (labkit.results): a rank's own list must not replace it
    assert not any("cores" in r for r in res.rows())


def test_memory_unknown_skips_the_check_and_says_so(monkeypatch, tmp_path):
    monkeypatch.setattr(psutil, "virtual_memory", _denied)
    monkeypatch.setattr(procs, "CGROUP_MEMORY_LIMITS", (str(tmp_path / "none"),))
    assert procs.available_memory_bytes() is None
    with pytest.warns(L.MemoryWarning, match="not checked"):
        L.check_memory(1e15, 2, world_size=2)
    limit = tmp_path / "memory.max"
    limit.write_text("max\n")  # cgroup v2 without a limit
    monkeypatch.setattr(procs, "CGROUP_MEMORY_LIMITS", (str(limit),))
    assert procs.available_memory_bytes() is None
    limit.write_text(f"{4 << 30}\n")
    assert procs.available_memory_bytes() == 4 << 30
    with pytest.raises(UsageError, match="4.3 GB available"):
        L.check_memory(3e9, 2, world_size=2)


def test_the_cgroup_limit_caps_what_the_system_has(monkeypatch, tmp_path):
    monkeypatch.setattr(psutil, "virtual_memory", lambda: types.SimpleNamespace(available=8 << 30))
    limit = tmp_path / "memory.max"
    limit.write_text(f"{2 << 30}\n")
    monkeypatch.setattr(procs, "CGROUP_MEMORY_LIMITS", (str(tmp_path / "absent"), str(limit)))
    assert procs.available_memory_bytes() == 2 << 30


@pytest.mark.parametrize("platform, scale", [("darwin", 1), ("linux", 1024)])
def test_peak_rss_is_bytes_on_every_platform(monkeypatch, platform, scale):
    import resource

    monkeypatch.setattr(resource, "getrusage", lambda who: types.SimpleNamespace(ru_maxrss=5000))
    monkeypatch.setattr(sys, "platform", platform)
    assert procs.peak_rss_bytes() == 5000 * scale  # macOS counts bytes, Linux KiB


def test_cpu_model_from_torch_sysctl_or_nothing(monkeypatch):
    caps = types.SimpleNamespace(get_capabilities=lambda: {"cpu_name": "Some CPU 9000"})
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cpu=caps))
    assert procs.cpu_model() == "Some CPU 9000"
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace())  # an old torch
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setattr(procs, "_sysctl_brand", lambda: "Apple M2")
    assert procs.cpu_model() == "Apple M2"
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(procs.platform, "processor", lambda: "")
    assert procs.cpu_model() is None


def test_kill_launch_finds_the_family_where_environments_are_withheld(monkeypatch):
    """No process shows its environment (as another user's on macOS): the processes below the
    agent, read before it goes, are still killed, though the agent's death orphaned them."""
    code = ("import subprocess, sys, time\n"
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'],"
            " start_new_session=True)\n"
            "time.sleep(120)\n")
    agent = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    deadline = time.time() + 30
    while not procs.descendants(agent.pid) and time.time() < deadline:
        time.sleep(0.05)
    family = procs.descendants(agent.pid)
    assert len(family) == 1, family
    monkeypatch.setattr(psutil.Process, "environ", _denied)
    orphans.kill_launch(agent, "no-launch-carries-this-id", grace_s=0.5)
    assert agent.poll() is not None
    assert not [p for p, start in family.items() if procs.alive(p, start)]


# -- a worker started by hand ---------------------------------------------------------------------
@pytest.mark.parametrize("env, says", [
    ({"LABKIT_HOST_PID": "abc"}, "LABKIT_HOST_PID must be a non-negative integer, got 'abc'"),
    ({"LABKIT_HOST_PID": str(2**31)}, "names no running launcher"),
    ({"LABKIT_HOST_PID": "1", "LABKIT_HOST_START": "yesterday"},
     "LABKIT_HOST_START must be the launcher's start time"),
    ({"RANK": "-1"}, "RANK must be a non-negative integer"),
])
def test_a_worker_started_by_hand_with_a_bad_environment_says_one_line(monkeypatch, capsys,
                                                                         env, says):
    from labkit import harness

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as info:
        harness.worker_main(lambda rt, cfg: {}, None, argv=[])
    err = capsys.readouterr().err.strip()
    assert info.value.code == 2 and err.splitlines() == [err] and says in err, err


def test_a_worker_whose_launcher_facts_are_withheld_runs(monkeypatch):
    """The launcher's start time cannot be read: the rank watches its pid alone."""
    from labkit import harness

    monkeypatch.setattr(psutil.Process, "create_time", _denied)
    monkeypatch.setenv("LABKIT_HOST_PID", str(os.getpid()))
    monkeypatch.setenv("LABKIT_HOST_START", "1.000")
    assert harness._watched_host() == (os.getpid(), "1.000")


# -- real launches without the Linux-only facts ---------------------------------------------------
def _no_proc_env(tmp_path: Path, **extra) -> dict:
    site = tmp_path / "site"
    site.mkdir()
    sitecustomize(site)
    path = os.pathsep.join(p for p in (str(site), str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "LABKIT_NO_PROC_LOG": str(tmp_path / "proc.log"),
            **extra}


def _proc_reads(tmp_path: Path) -> str:
    log = tmp_path / "proc.log"
    return log.read_text() if log.exists() else ""


@pytest.mark.slow
def test_a_launch_runs_where_labkit_cannot_read_proc(tmp_path):
    """Host, agent and ranks without /proc, affinity or prctl: a 2-rank launch that lasts
    seconds (the heartbeat must keep its ranks alive) succeeds, and the memory check works."""
    code = (
        "import json, os, psutil\n"
        "from labkit.errors import UsageError\n"
        "from labkit.launch import check_memory, launch\n"
        "from labkit.procs import allocated_cores, available_memory_bytes\n"
        "assert not hasattr(os, 'sched_getaffinity')\n"
        "assert not hasattr(psutil.Process, 'cpu_affinity')\n"
        "try:\n"
        "    check_memory(1e15, 2, world_size=2)\n"
        "    refused = ''\n"
        "except UsageError as e:\n"
        "    refused = str(e)\n"
        "res = launch('selftest', 2, {'sleep_s': 4.0}, timeout_s=240)\n"
        "print(json.dumps({'rows': res.rows(), 'placement': res.placement, 'refused': refused,\n"
        "                  'memory': available_memory_bytes(), 'cores': allocated_cores(),\n"
        "                  'peak': res.peak_rss_bytes_per_rank, 'wall': res.wall_time_s}))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=_no_proc_env(tmp_path),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert _proc_reads(tmp_path) == ""
    assert got["wall"] > 4 and got["rows"][0]["rank_sum"] == 1.0
    assert [p["rank"] for p in got["placement"]] == [0, 1]
    assert all(p["device_name"].startswith("cpu") for p in got["placement"])
    assert got["memory"] > 0 and "GB available" in got["refused"]
    assert got["cores"] == psutil.cpu_count(logical=True)
    assert got["peak"] > 1 << 20  # bytes, not KiB


@pytest.mark.slow
def test_killing_the_host_leaves_nothing_where_labkit_cannot_read_proc(tmp_path):
    """No parent-death signal (macOS): once the host is SIGKILLed, each rank's heartbeat sees
    its launcher gone and exits, and the agent follows its ranks."""
    mark = f"portable-{os.getpid()}-{time.time_ns()}"
    code = ("from labkit.launch import launch\n"
            "launch('selftest', 2, {'sleep_s': 300.0}, timeout_s=600)\n")
    host = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path,
                            env=_no_proc_env(tmp_path, LABKIT_TEST_MARK=mark),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def marked():
        return [p for p in procs.processes_of(mark, "LABKIT_TEST_MARK") if p != host.pid]

    try:
        deadline = time.time() + 120
        while len(marked()) < 3 and time.time() < deadline:  # the agent and 2 ranks
            time.sleep(0.3)
        if len(marked()) < 3:
            host.kill()
            pytest.fail("the launch never started: " + host.communicate()[1].decode()[-4000:])
        time.sleep(4)  # several heartbeats: none may take its launcher for gone
        assert len(marked()) >= 3 and host.poll() is None
        host.kill()
        host.wait()
        deadline = time.time() + 15
        while marked() and time.time() < deadline:
            time.sleep(0.2)
        left = marked()
    finally:
        for pid in marked():  # do not leave them to the next test
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if host.poll() is None:
            host.kill()
    assert left == [], f"still running 15 s after the host was SIGKILLed: {left}"
    assert _proc_reads(tmp_path) == ""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="psutil's boot time: Linux")
def test_a_wall_clock_step_leaves_a_live_process_alive(monkeypatch):
    """psutil dates a Linux process from the boot time, which a stepped wall clock moves (a
    resumed laptop, NTP): the token counts from boot, so the launcher stays itself."""
    import psutil._pslinux as pslinux

    me = os.getpid()
    token, started = procs.process_start(me), psutil.Process(me).create_time()
    booted = psutil.boot_time()
    monkeypatch.setattr(pslinux, "boot_time", lambda: booted + 2.0)
    monkeypatch.setattr(psutil, "boot_time", lambda: booted + 2.0)
    assert psutil.Process(me).create_time() > started + 1.0  # the clock did move
    assert procs.alive(me, token)


def test_no_preexec_fn_off_linux(monkeypatch):
    monkeypatch.setattr(orphans.sys, "platform", "darwin")
    assert orphans.die_with_parent(os.getpid()) is None
