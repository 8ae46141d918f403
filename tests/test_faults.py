"""Faults a user, a batch system or a full disk inflict: nothing outlives its launcher, no
measurement is lost, every file handed in is checked before anything launches."""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from labkit import results
from labkit.cli import main
from labkit.errors import ResultsFileError, ResultsNotStored
from labkit.procs import processes_of

ROOT = Path(__file__).resolve().parent.parent
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x02\x00\x00\x00\x90wS\xde"


def _marked(mark: str, exclude=()) -> list[int]:
    return [p for p in processes_of(mark, "LABKIT_TEST_MARK") if p not in exclude]


# -- files a user hands in --------------------------------------------------------------------
@pytest.fixture
def png(tmp_path):
    path = tmp_path / "figure.png"
    path.write_bytes(PNG)
    return path


@pytest.fixture
def rows_of_strings(tmp_path):
    path = tmp_path / "strings.json"
    path.write_text(json.dumps({"format": "labkit-results", "version": 1, "rows": ["a", "b"]}))
    return path


@pytest.mark.parametrize("which", ["png", "rows_of_strings"])
def test_a_file_that_is_not_a_results_file_is_refused_in_one_line(which, request, capsys):
    path = request.getfixturevalue(which)
    before = path.read_bytes()
    with pytest.raises(ResultsFileError, match="not a labkit results file"):
        results.read_rows(path)
    for argv in (["table", str(path)], ["diff", str(path), str(path)],
                 ["solve", "--total-dof", "100", "--nproc", "1", "--json", str(path)],
                 ["speedup", "--times", "1:10", "2:6", "--json", str(path)]):
        t0 = time.perf_counter()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and str(path) in err, (argv, err)
        assert time.perf_counter() - t0 < 5  # refused before anything launched
    assert path.read_bytes() == before


def test_a_run_that_cannot_fit_in_memory_is_refused_before_launch(tmp_path, capsys):
    store = tmp_path / "big.json"
    t0 = time.perf_counter()
    assert main(["solve", "--total-dof", "1000000000000", "--nproc", "2",
                 "--json", str(store)]) == 2
    err = capsys.readouterr().err
    assert "GB per rank" in err and "available" in err and len(err.strip().splitlines()) == 1
    assert time.perf_counter() - t0 < 5 and not store.exists()


def test_a_model_too_big_for_memory_is_refused_before_launch(capsys):
    assert main(["ddp", "--nproc", "1", "--hidden-dim", "200000"]) == 2
    err = capsys.readouterr().err
    assert "1 rank needs about" in err and "available" in err


def test_bad_flag_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        main(["solve", "--nproc", "0"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and "--nproc" in err and ">= 1" in err


def test_sigterm_exits_143(monkeypatch):
    from labkit import cli
    from labkit.launch import Terminated

    def handler(args):
        exc = Terminated("received SIGTERM")
        exc.signum = signal.SIGTERM
        raise exc

    parser = cli.build_parser()
    args = parser.parse_args(["table", "x.json"])
    monkeypatch.setattr(cli, "build_parser", lambda: _Fixed(parser, args, handler))
    assert cli.main(["table", "x.json"]) == 143


class _Fixed:
    def __init__(self, parser, args, handler):
        self.args = args
        args.func = handler

    def parse_args(self, argv):
        return self.args


# -- a full disk, a shared file, killed writers ---------------------------------------------------
def test_disk_full_keeps_the_old_file_and_hands_back_the_rows(tmp_path, monkeypatch, capsys):
    store = tmp_path / "r.json"
    results.record(store, [{"x": 1}], key=("x",))
    before = store.read_bytes()

    def full(path, doc):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(results, "_atomic_write", full)
    rows = [{"x": i, "time_s": 0.1 * i} for i in range(2, 20)]
    with pytest.raises(ResultsNotStored, match="No space left on device") as e:
        results.store_rows(store, rows, key=("x",))
    assert store.read_bytes() == before
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["rows"] == rows
    fallback = Path(str(e.value).split("saved to ")[1].split(" ")[0])
    try:
        assert json.loads(fallback.read_text())["rows"] == rows
    finally:
        fallback.unlink()


def test_disk_full_on_a_real_tmpfs(tmp_path, capsys):
    """Where a small tmpfs can be mounted (root): the same through the CLI, exit code 1."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)],
                      capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (not root, or no mount namespace)")
    try:
        store = mnt / "r.json"
        times = [f"{n}:{100 / n:.3f}" for n in range(1, 11)]
        assert main(["speedup", "--times", *times, "--json", str(store)]) == 0
        before = store.read_bytes()
        fd = os.open(mnt / "filler", os.O_WRONLY | os.O_CREAT)  # fill it to the last byte
        try:
            while os.write(fd, b"\0" * 512):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        capsys.readouterr()
        rc = main(["speedup", "--times", *times, "--cores-per-rank", "2", "--json", str(store)])
        out, err = capsys.readouterr()
        assert rc == 1 and "rows not stored" in err and len(err.strip().splitlines()) == 1
        assert store.read_bytes() == before
        assert len(json.loads(out.strip().splitlines()[-1])["rows"]) == 10
        saved = Path(err.split("saved to ")[1].split(" ")[0])
        assert saved.exists()
        saved.unlink()
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_a_write_keeps_the_files_mode_and_cleans_killed_writers_leftovers(tmp_path):
    store = tmp_path / "shared.json"
    results.record(store, [{"x": 1}], key=("x",))
    os.chmod(store, 0o664)
    stale = tmp_path / ".shared.json.abc123.tmp"
    stale.write_text("{half a fi")
    old = time.time() - 2 * results.STALE_TMP_S
    os.utime(stale, (old, old))
    results.record(store, [{"x": 2}], key=("x",))
    assert stat.S_IMODE(store.stat().st_mode) == 0o664
    assert not stale.exists()
    assert [r["x"] for r in results.read_rows(store)] == [1, 2]


# -- nothing outlives its launcher --------------------------------------------------------------
@pytest.mark.slow
def test_sigkill_of_the_host_leaves_no_process_of_the_launch():
    mark = uuid.uuid4().hex
    code = ("from labkit.launch import launch\n"
            "launch('selftest', 2, {'fault': 'hang', 'fault_rank': 1}, timeout_s=300)\n")
    host = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT,
                            env={**os.environ, "LABKIT_TEST_MARK": mark},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while len(_marked(mark, {host.pid})) < 3 and time.time() < deadline:  # agent + 2 ranks
        time.sleep(0.3)
    assert len(_marked(mark, {host.pid})) >= 3, "the launch never started"
    time.sleep(2)
    host.kill()
    host.wait()
    t0 = time.time()
    while _marked(mark) and time.time() - t0 < 5:
        time.sleep(0.1)
    left = _marked(mark)
    for pid in left:  # do not leave them to the next test
        os.kill(pid, signal.SIGKILL)
    assert left == [], f"still running 5 s after the host was SIGKILLed: {left}"


@pytest.mark.slow
def test_a_dead_kernel_leaves_no_process_before_the_next_run(tmp_path):
    """A notebook whose kernel dies mid-launch (the OOM killer, say): when ``execute`` returns,
    none of that kernel's ranks is left to skew the next sweep point."""
    import nbformat

    from labkit.book.notebooks import execute

    mark = uuid.uuid4().hex
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("steps: int = 1  # a parameter", metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell(
            "import os, threading, time\n"
            f"os.environ['LABKIT_TEST_MARK'] = '{mark}'\n"
            "from labkit.launch import launch\n"
            "threading.Thread(target=launch, args=('selftest', 2, {'fault': 'hang', "
            "'fault_rank': 1}), kwargs={'timeout_s': 300, }, daemon=True).start()\n"
            # the kernel set the mark after it started, so only the agent and its 2 ranks
            # carry it in the environment they started with
            "from labkit.procs import processes_of\n"
            "deadline = time.time() + 120\n"
            "while len(processes_of(os.environ['LABKIT_TEST_MARK'], 'LABKIT_TEST_MARK')) < 3 "
            "and time.time() < deadline:\n"
            "    time.sleep(0.3)\n"
            "time.sleep(2)\n"
            "os.kill(os.getpid(), 9)\n"),
    ]
    path = tmp_path / "dies.ipynb"
    nbformat.write(nb, path)
    res = execute(path, tmp_path / "out.ipynb", {"steps": 1}, cwd=tmp_path)
    assert not res["ok"], res
    left = _marked(mark)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert left == []


@pytest.mark.slow
def test_timeout_names_the_rank_that_stopped():
    from labkit.errors import LaunchTimeout
    from labkit.launch import launch

    with pytest.raises(LaunchTimeout, match=r"rank 1 stopped \(no heartbeat"):
        launch("selftest", 2, {"fault": "stop", "fault_rank": 1}, timeout_s=15)


def test_stale_workdirs_of_dead_launchers_are_removed(tmp_path):
    from labkit.launch import clean_stale_workdirs
    from labkit.procs import process_start

    dead = tmp_path / "labkit-solve-dead"
    dead.mkdir()
    (dead / "owner").write_text("999999999 12345")
    alive = tmp_path / "labkit-solve-alive"
    alive.mkdir()
    (alive / "owner").write_text(f"{os.getpid()} {process_start(os.getpid())}")
    reused = tmp_path / "labkit-solve-reused"  # its owner's pid now names another process
    reused.mkdir()
    (reused / "owner").write_text(f"{os.getpid()} 12.000")
    assert sorted(clean_stale_workdirs(str(tmp_path))) == [dead, reused]
    assert alive.exists() and not dead.exists() and not reused.exists()


def test_a_second_ctrl_c_waits_until_the_launch_is_killed():
    """Ctrl-C while the launcher is still killing a launch (an agent that ignores SIGTERM
    keeps it in its grace period): the kill finishes, then the interrupt is raised."""
    import threading

    from labkit.orphans import LAUNCH_ENV, kill_launch
    from labkit.procs import alive

    launch_id = uuid.uuid4().hex
    agent = subprocess.Popen(["bash", "-c", "trap '' TERM; sleep 60 & wait"],
                             env={**os.environ, LAUNCH_ENV: launch_id}, start_new_session=True)
    time.sleep(0.3)
    # Python's own Ctrl-C handler, whatever this process inherited (a job started in the
    # background of a shell, as CI may be, begins with SIGINT ignored)
    saved = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            kill_launch(agent, launch_id, grace_s=2.0)
    finally:
        signal.signal(signal.SIGINT, saved)
    assert time.monotonic() - t0 >= 2.0  # the interrupt waited for the kill
    assert agent.poll() is not None and not alive(agent.pid)
