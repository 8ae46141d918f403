"""The cluster path: the sbatch script ``labkit slurm`` writes, the allocation's threads, a
multi-node command on the node without rank 0, and a real SLURM running the scripts.

Fast tests check the script's text and run it in bash against stub ``scontrol``/``srun``. The
``slow`` test starts two ``labkit solve`` agents of a 2-node launch on this machine. The
``slurm`` test starts a local SLURM (munge, slurmctld, two slurmd posing as two nodes:
tests/slurm/local_cluster.py), submits the generated CPU scripts of a 1-node 2-rank solve and a
2-node solve, and stops every daemon by PID afterwards.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from labkit import launch as L
from labkit.cli import main
from labkit.errors import RowsOnAnotherNode, UsageError
from labkit.slurm import PORT_SPAN, SlurmJob, default_bin_dir, parse_walltime, render
from tests.conftest import LAUNCH_TIMEOUT_S
from tests.slurm.local_cluster import LocalSlurm, missing

SOLVE = ("labkit", "solve", "--total-dof", "4096")  # a tiny strong-scaling solve


# -- the script's text ---------------------------------------------------------------------

def test_sbatch_script_is_valid_bash_with_rendezvous(tmp_path):
    job = SlurmJob(("labkit", "collectives", "--op", "all_reduce"), 2, 4, "00:30:00", "gpu", "mylab")
    text = render(job)
    for needle in ("#SBATCH --nodes=2", "#SBATCH --gres=gpu:4", "#SBATCH --account=mylab",
                   "#SBATCH --partition=gpu", "#SBATCH --time=00:30:00", "scontrol show hostnames",
                   "--rdzv-endpoint \"$RDZV_ENDPOINT\"", "--rdzv-id \"$SLURM_JOB_ID\"",
                   "--nnodes \"$SLURM_NNODES\"", "--node-rank \"$SLURM_NODEID\"", "srun", "--nproc 4"):
        assert needle in text, needle
    assert "SU = " in text and job.cost()["su"] == pytest.approx((8 + 2 * 8) * 0.5)
    path = tmp_path / "job.sbatch"
    path.write_text(text)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    py = render(SlurmJob(("python", "train.py", "--lr", "0.1"), 4, 8, "1-00:00:00", "gpu", "lab"))
    assert "torchrun" in py and "--rdzv-backend c10d" in py and "train.py --lr 0.1" in py
    path.write_text(py)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0


def test_slurm_bad_input():
    assert parse_walltime("02:00:00") == 7200
    with pytest.raises(UsageError, match="--time"):
        SlurmJob(("labkit", "env"), 1, 1, "90 minutes", "gpu", "a")
    with pytest.raises(UsageError, match="--partition"):
        SlurmJob(("labkit", "env"), 1, 1, "00:10:00", "gpu; rm -rf", "a")
    with pytest.raises(UsageError, match="--rdzv-endpoint"):
        SlurmJob(("labkit", "solve", "--rdzv-endpoint", "h:1"), 1, 1, "00:10:00", "gpu", "a")
    with pytest.raises(UsageError, match="labkit' or 'python'"):
        SlurmJob(("rm", "-rf", "/"), 1, 1, "00:10:00", "gpu", "a")
    with pytest.raises(UsageError, match="--gpus-per-node must be an integer >= 0"):
        SlurmJob(SOLVE, 1, -1, "00:10:00")
    with pytest.raises(UsageError, match="share GPUs"):
        SlurmJob(SOLVE + ("--nproc", "8"), 1, 4, "00:10:00")
    with pytest.raises(UsageError, match="--ranks-per-node 3"):
        SlurmJob(SOLVE + ("--nproc", "1", "2"), 1, 0, "00:10:00", ranks_per_node=3)
    with pytest.raises(UsageError, match="one non-empty shell line"):
        SlurmJob(SOLVE, 1, 0, "00:10:00", setup="module load x\nrm -rf /")
    with pytest.raises(UsageError, match="absolute"):
        SlurmJob(SOLVE, 1, 0, "00:10:00", bin_dir="venv/bin")


def test_cpu_job_has_no_gres_and_charges_cores():
    job = SlurmJob(SOLVE + ("--nproc", "2"), 1, 0, "00:30:00")
    text = render(job)
    assert "--gres" not in text and "--account" not in text and "--partition" not in text
    assert "#SBATCH --cpus-per-task=2" in text and "srun --export=ALL" in text
    assert "--cpus-per-task=2 --kill-on-bad-exit=1" in text  # srun does not inherit it
    assert "1 node x 2 ranks (CPU)" in text and "2 cores x 00:30:00 = 1.00 core-hours" in text
    assert job.cost_line() == ("at most 1.00 core-hours, 1.00 SU (1 node x 2 ranks (CPU), "
                               "2 cores per node, 00:30:00)")
    assert "OMP_NUM_THREADS" not in text  # labkit sets it from the allocation
    # the command's largest --nproc is the ranks per node; cores default to one per rank
    job = SlurmJob(SOLVE + ("--nproc", "1", "4"), 2, 0, "00:10:00")
    assert (job.ranks_per_node, job.cpus_per_task) == (4, 4)
    assert job.shape() == "2 nodes x 4 ranks (CPU)"
    # no --nproc: one rank per node (a GPU job: one per GPU), added to the command
    assert SlurmJob(SOLVE, 2, 0, "00:10:00").labkit_argv[-2:] == ["--nproc", "1"]
    assert SlurmJob(SOLVE, 1, 1, "00:10:00").shape() == "1 node x 1 GPU"
    py = render(SlurmJob(("python", "t.py"), 1, 0, "00:10:00", ranks_per_node=3, cpus_per_task=6))
    assert "--nproc-per-node 3" in py and "SLURM_CPUS_PER_TASK / 3" in py and "--gres" not in py


def test_environment_is_activated_in_the_script():
    text = render(SlurmJob(SOLVE, 1, 0, "00:10:00"))
    assert f"export PATH={default_bin_dir()}:" in text and Path(default_bin_dir()).is_absolute()
    assert "command -v labkit" in text
    line = "module load python/3.11; source /home/me/venv/bin/activate"
    text = render(SlurmJob(SOLVE, 1, 0, "00:10:00", setup=line))
    assert line in text.splitlines() and "export PATH=" not in text
    # the setup line runs before `set -u`: activate scripts read unset variables
    assert text.index(line) < text.index("set -u")


def _fake_slurm(tmp_path: Path) -> dict:
    """Stub scontrol and srun on PATH: srun records its arguments and runs nothing."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "scontrol").write_text(
        '#!/bin/bash\ncase "$1 $2" in\n'
        '  "show hostnames") printf "nodeB\\nnodeC\\n" ;;\n'
        '  "show node") echo "   NodeAddr=10.1.2.3 NodeHostName=nodeB Version=22.05.8" ;;\n'
        '  *) exit 1 ;;\nesac\n')
    (bin_ / "srun").write_text('#!/bin/bash\nprintf "%s\\n" "$@" > "$SRUN_ARGS"\n'
                               'echo "$RDZV_ENDPOINT" >> "$SRUN_ARGS"\n')
    for f in bin_.iterdir():
        f.chmod(0o755)
    return {"PATH": f"{bin_}:{os.environ['PATH']}", "SLURM_JOB_ID": "123456",
            "SLURM_JOB_NODELIST": "node[B-C]", "SLURM_NNODES": "2", "SLURM_CPUS_PER_TASK": "2",
            "SRUN_ARGS": str(tmp_path / "srun.args")}


def test_script_runs_and_derives_the_port_from_the_job_id(tmp_path):
    script = tmp_path / "job.sbatch"
    script.write_text(render(SlurmJob(SOLVE + ("--nproc", "2"), 2, 0, "00:10:00")))
    env = _fake_slurm(tmp_path)
    out = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    args = Path(env["SRUN_ARGS"]).read_text().splitlines()
    port = 29500 + 123456 % PORT_SPAN
    assert args[-1] == f"10.1.2.3:{port}"  # the head node's address as SLURM knows it
    assert "--cpus-per-task=2" in args and "--export=ALL" in args
    assert f"rendezvous 10.1.2.3:{port}" in out.stdout
    # another job id, another port: two jobs sharing a node do not share a rendezvous
    env["SLURM_JOB_ID"] = "123457"
    subprocess.run(["bash", str(script)], env=env, check=True, capture_output=True)
    assert Path(env["SRUN_ARGS"]).read_text().splitlines()[-1] == f"10.1.2.3:{port + 1}"


def test_script_stops_when_the_environment_lacks_the_command(tmp_path):
    script = tmp_path / "job.sbatch"
    script.write_text(render(SlurmJob(SOLVE, 1, 0, "00:10:00", setup="true")))
    env = _fake_slurm(tmp_path)
    env["PATH"] = f"{tmp_path / 'bin'}:/usr/bin:/bin"  # no labkit here
    out = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert out.returncode == 1 and "labkit: not found" in out.stderr
    assert not Path(env["SRUN_ARGS"]).exists()


# -- labkit slurm: the wrapped command is checked as the command checks it ----------------

def test_cli_writes_a_cpu_job_and_records_its_cost(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["slurm", "--nodes", "1", "--gpus-per-node", "0", "--time", "00:10:00",
                 "--out", "j.sbatch", "--json", "cost.json", "--", *SOLVE, "--nproc", "2"]) == 0
    out = capsys.readouterr()
    assert "1 node x 2 ranks (CPU)" in out.out and "core-hours" in out.out
    assert "passes the checks it makes before a launch" in out.err
    assert "--gres" not in (tmp_path / "j.sbatch").read_text()
    from labkit.results import read_rows

    row = read_rows(str(tmp_path / "cost.json"))[0]
    assert (row["gpus"], row["cores"], row["ranks"]) == (0, 2, 2)


@pytest.mark.parametrize("argv, match", [
    (["--", "labkit", "solve", "--nproc", "2"], "strong mode needs --total-dof"),
    (["--", *SOLVE, "--bogus"], "unrecognized arguments: --bogus"),
    (["--", *SOLVE, "--nproc", "0"], ">= 1"),
    (["--", *SOLVE, "--json", "/nonexistent/x.json"], "/nonexistent"),
    (["--", "labkit", "sweep", "nb.ipynb"], "refused as a 2-node labkit launch"),
    (["--", *SOLVE, "--nnodes", "3"], "leave them out"),
])
def test_cli_refuses_what_the_command_would_refuse(argv, match, tmp_path, capsys):
    script = tmp_path / "j.sbatch"
    assert main(["slurm", "--nodes", "2", "--gpus-per-node", "0", "--time", "00:10:00",
                 "--out", str(script), *argv]) == 2
    assert match in capsys.readouterr().err
    assert not script.exists()


def test_check_command_uses_the_commands_validate_hook():
    from labkit.cli import check_command

    args = check_command([*SOLVE[1:], "--nproc", "2"])
    assert callable(args.validate)
    with pytest.raises(UsageError, match="total-dof"):
        check_command(["solve", "--mode", "strong", "--nproc", "2"])


# -- threads follow the allocation ---------------------------------------------------------

def test_threads_follow_the_slurm_allocation(monkeypatch):
    from labkit import procs

    monkeypatch.setattr(procs, "available_cores", lambda: 16)
    for var in ("SLURM_JOB_ID", "SLURM_CPUS_PER_TASK"):
        monkeypatch.delenv(var, raising=False)
    assert L.allocated_cores() == 16 and L.default_threads(4) == 4
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "4")
    assert L.allocated_cores() == 4 and L.default_threads(2) == 2 and L.default_threads(8) == 1
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "1")  # 2 ranks on 1 core: 1 thread, oversubscribed
    assert L.default_threads(2) == 1
    monkeypatch.setattr(procs, "available_cores", lambda: 2)  # a binding mask tighter still
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "8")
    assert L.allocated_cores() == 2


def test_oversubscription_is_judged_against_the_allocation(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "1")
    seen = {}

    def fake_run(spec, backend, threads, oversubscribed, workdir, echo):
        seen.update(threads=threads, oversubscribed=oversubscribed)

    monkeypatch.setattr(L, "_run", fake_run)
    with pytest.warns(L.OversubscribedWarning, match="1 allocated cores"):
        L.run_spec(L.LaunchSpec(worker="placement", nproc=2))
    assert seen == {"threads": 1, "oversubscribed": True}


def test_rows_record_the_slurm_job_id(monkeypatch):
    spec = L.LaunchSpec(worker="placement", nproc=1)
    res = L.LaunchResult(spec=spec, backend="gloo", threads_per_rank=1, oversubscribed=False,
                         payload={"rows": [{"x": 1}]}, logs={}, wall_time_s=1.0, command=())
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    assert res.rows()[0]["slurm_job_id"] == 4242
    monkeypatch.delenv("SLURM_JOB_ID")
    assert res.rows()[0]["slurm_job_id"] is None
    assert "slurm_job_id" in {c.name for c in L.LAUNCH_COLUMNS}


# -- the node without global rank 0 -----------------------------------------------------------

def _no_rows(rank0_host=None):
    spec = L.LaunchSpec(worker="placement", nproc=1, nnodes=2, rdzv_endpoint="h:1")
    return L.LaunchResult(spec=spec, backend="gloo", threads_per_rank=1, oversubscribed=False,
                          payload=None, logs={}, wall_time_s=1.0, command=(),
                          rank0_host=rank0_host)


@dataclasses.dataclass(frozen=True)
class _NoConfig:
    pass


def test_rows_elsewhere_empty_or_raise(monkeypatch):
    with pytest.raises(UsageError, match="rows_elsewhere"):
        L.LaunchOptions(rows_elsewhere="ignore")
    opts = dict(nprocs=1, nnodes=2, rdzv_endpoint="127.0.0.1:29500")
    where = {"host": "gpu07", "node": "gpu07"}
    monkeypatch.setattr(L, "_run_specs", lambda specs, **kw: [_no_rows(where)])
    assert L.launch_lab("placement", _NoConfig(), L.LaunchOptions(**opts))[0].payload is None
    with pytest.raises(RowsOnAnotherNode, match=r"results are on node gpu07 \(host gpu07\); "
                                                r"this node has none"):
        L.launch_lab("placement", _NoConfig(), L.LaunchOptions(**opts, rows_elsewhere="raise"))
    assert "host h2" in str(L.rows_on_another_node([_no_rows({"host": "h2", "node": None})]))


def test_cli_prints_one_line_and_exits_0_on_the_node_without_rows(monkeypatch, capsys):
    import importlib

    solve_run = importlib.import_module("labkit.solve.run")  # the module, not the function

    def run(config, launch=None, store=None):
        assert launch.rows_elsewhere == "raise"  # what the CLI asks for
        raise RowsOnAnotherNode("results are on node n1 (host vm); this node has none")

    monkeypatch.setattr(solve_run, "run", run)
    assert main([*SOLVE[1:], "--nproc", "1", "--nnodes", "2", "--rdzv-endpoint", "h:1"]) == 0
    out = capsys.readouterr()
    assert out.err.strip() == "labkit solve: results are on node n1 (host vm); this node has none"
    assert out.out == ""


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_solve_agents_exit_0_and_one_writes_the_rows(tmp_path):
    port = _free_port()
    procs = [subprocess.Popen(
        [sys.executable, "-m", "labkit.cli", *SOLVE[1:], "--nproc", "1", "--nnodes", "2",
         "--node-rank", str(r), "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "two-agents",
         "--timeout", str(LAUNCH_TIMEOUT_S), "--json", str(tmp_path / f"node{r}.json")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
        for r in (0, 1)]
    outs = [p.communicate(timeout=2 * LAUNCH_TIMEOUT_S) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        assert "Traceback" not in out + err
    written = [r for r in (0, 1) if (tmp_path / f"node{r}.json").exists()]
    assert len(written) == 1, outs
    rows = json.loads((tmp_path / f"node{written[0]}.json").read_text())["rows"]
    assert len(rows) == 1 and rows[0]["world_size"] == 2 and rows[0]["nnodes"] == 2
    other = 1 - written[0]
    assert "STRONG SCALING" in outs[written[0]][0] and outs[other][0] == ""
    last = outs[other][1].strip().splitlines()[-1]
    assert re.fullmatch(r"labkit solve: results are on host \S+; this node has none", last), last


# -- a real SLURM ----------------------------------------------------------------------------

def _needs_slurm():
    reason = missing()
    if reason and not os.environ.get("CI"):
        pytest.skip(f"local SLURM: {reason}")


@pytest.mark.slow
@pytest.mark.slurm
def test_real_slurm_runs_a_one_node_and_a_two_node_cpu_job():
    _needs_slurm()
    folder = Path(tempfile.mkdtemp(prefix="slurmtest-", dir="/tmp"))
    cluster = LocalSlurm(folder, nodes=2)
    t0 = time.perf_counter()
    try:
        cluster.start()
        work = folder / "work"
        work.mkdir(mode=0o755)
        jobs = {}
        for name, nodes, nproc in (("one", 1, 2), ("two", 2, 1)):
            script = work / f"{name}.sbatch"
            argv = ["slurm", "--nodes", str(nodes), "--gpus-per-node", "0", "--time", "00:05:00",
                    "--job-name", name, "--out", str(script), "--",
                    *SOLVE, "--nproc", str(nproc), "--json", f"{name}.json"]
            out = subprocess.run([sys.executable, "-m", "labkit.cli", *argv], cwd=work,
                                 capture_output=True, text=True)
            assert out.returncode == 0, out.stderr
            jobs[name] = cluster.submit(script, cwd=work)
        ends = cluster.wait(list(jobs.values()), timeout_s=300)
        report = {name: {k: ends[j].get(k) for k in ("JobState", "ExitCode", "NodeList", "RunTime")}
                  for name, j in jobs.items()}
        print(f"local SLURM jobs after {time.perf_counter() - t0:.0f} s: {report}")
        logs = {name: (work / f"{name}-{j}.out").read_text(errors="replace")
                for name, j in jobs.items() if (work / f"{name}-{j}.out").exists()}
        for name, j in jobs.items():
            assert ends[j].get("JobState") == "COMPLETED", (name, ends[j], logs.get(name))
            assert ends[j].get("ExitCode") == "0:0"
            text = logs[name]
            assert "Traceback" not in text, text
            port = 29500 + j % PORT_SPAN
            assert f"rendezvous 127.0.0.1:{port}" in text  # the port follows the job id
            rows = json.loads((work / f"{name}.json").read_text())["rows"]
            nodes = 1 if name == "one" else 2
            assert len(rows) == 1 and rows[0]["slurm_job_id"] == j
            assert (rows[0]["nnodes"], rows[0]["world_size"]) == (nodes, 2)
            assert rows[0]["gate_passed"] is True
        assert ends[jobs["two"]]["NodeList"] == "node[1-2]"
        # the node without global rank 0 said so in one line, and printed no table
        elsewhere = re.findall(r"labkit solve: results are on node (node\d) \(host \S+\); "
                               r"this node has none", logs["two"])
        assert len(elsewhere) == 1 and logs["two"].count("STRONG SCALING") == 1
        assert "oversubscribed" not in logs["one"]
    finally:
        left = cluster.stop()
        import shutil

        shutil.rmtree(folder, ignore_errors=True)
    assert left == [], f"still running after stop: {left}"
