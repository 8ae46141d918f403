"""A real SLURM on this machine for the tests: munge, slurmctld, and slurmd daemons posing as nodes.

    python tests/slurm/local_cluster.py up DIR [--nodes 2]   # then: export SLURM_CONF=DIR/slurm.conf
    python tests/slurm/local_cluster.py down DIR             # stops every daemon by its PID

Everything lives in DIR (a fresh folder): the munge key and socket, ``slurm.conf``, state,
spool, logs, and ``pids`` (one line per daemon). Two slurmd on one machine pose as two nodes
(``slurmd -N nodeX``, a NodeName entry each with its own port, all at 127.0.0.1), so a job of
two "nodes" runs two tasks here, each believing it is on a node of its own.

Needs root (the daemons and jobs run as root) and Debian's ``munge`` and ``slurm-wlm``
(``make setup-slurm``). There is no slurmdbd: ``sacct`` has nothing to read, so job states come
from ``scontrol show job`` (kept for MinJobAge = 10 minutes) and the job-completion log
``DIR/jobcomp.txt``. No cgroups or CPU binding (``proctrack/linuxproc``, ``task/none``), so it
runs in a container; each node declares at least 4 CPUs, so a 1-node job and a 2-node job fit
at once and share node1 (two rendezvous on one node, as two users' jobs would).

Stopping is by PID: the daemons this started (their PIDs, recorded), then every process still
carrying this cluster's marker in its environment (``LABKIT_TEST_SLURM=DIR``: the daemons
pass it to slurmstepd and the jobs), so nothing is left running.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from labkit.procs import alive, processes_of

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "scontrol", "sinfo", "scancel")
MARK = "LABKIT_TEST_SLURM"
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "PREEMPTED", "BOOT_FAIL", "DEADLINE")


def missing() -> str | None:
    """Why a local SLURM cannot run here (None: it can)."""
    if sys.platform != "linux":
        return "needs Linux"
    gone = [b for b in DAEMONS + CLIENTS if shutil.which(b) is None
            and not Path("/usr/sbin", b).exists()]
    if gone:
        return (f"needs Debian's slurm-wlm and munge ({', '.join(gone)} not installed; "
                "make setup-slurm, as root)")
    if os.geteuid() != 0:
        return "needs root (slurmd starts job steps as their user)"
    return None


def _exe(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _free_ports(n: int) -> list[int]:
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def _die_with_parent():
    """preexec_fn: SIGTERM the daemon when the test process dies, however it dies."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def marked(folder: str | os.PathLike) -> list[int]:
    """PIDs of live processes (not this one) carrying the marker of the cluster in ``folder``."""
    me = os.getpid()
    return [p for p in processes_of(str(Path(folder).resolve()), MARK) if p != me and alive(p)]


class LocalSlurm:
    """``with LocalSlurm(folder, nodes=2) as cluster:`` a running cluster; ``cluster.env`` is
    the environment its clients need (``SLURM_CONF``); leaving the block stops it."""

    def __init__(self, folder: str | os.PathLike, nodes: int = 2, cpus_per_node: int | None = None,
                 tied: bool = True):
        self.dir = Path(folder).resolve()
        self.nodes = [f"node{i + 1}" for i in range(nodes)]
        self.cpus = cpus_per_node or max(4, len(os.sched_getaffinity(0)))
        self.tied = tied  # daemons end with this process (tests); False for the command line
        self.conf = self.dir / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf), MARK: str(self.dir)}
        self.pids: dict[str, int] = {}

    # -- start -----------------------------------------------------------------------------
    def start(self, timeout_s: float = 60.0) -> LocalSlurm:
        reason = missing()
        if reason:
            raise RuntimeError(f"local SLURM: {reason}")
        self.dir.mkdir(parents=True, exist_ok=True)
        # munged insists that every folder above its socket is searchable by all
        for d in [self.dir, *self.dir.parents]:
            if not os.stat(d).st_mode & 0o001:
                if d == self.dir:
                    d.chmod(0o755)
                else:
                    raise RuntimeError(f"local SLURM: {d} is not searchable by all (munged needs "
                                       "it); use a folder under /tmp")
        for sub in ("munge", "state", "spool", "logs"):
            (self.dir / sub).mkdir(exist_ok=True)
            (self.dir / sub).chmod(0o755)
        key = self.dir / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        try:
            self._start_munge()
            self._write_conf()
            self._start("slurmctld", [_exe("slurmctld"), "-D", "-f", str(self.conf)])
            for node in self.nodes:
                self._start(f"slurmd-{node}", [_exe("slurmd"), "-D", "-f", str(self.conf), "-N", node])
            self._wait_idle(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, name: str, argv: list[str]) -> int:
        log = open(self.dir / "logs" / f"{name}.stdout", "wb")  # noqa: SIM115 - the daemon's
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env=self.env, cwd=self.dir, start_new_session=True,
                                preexec_fn=_die_with_parent if self.tied else None)
        log.close()
        self.pids[name] = proc.pid
        with open(self.dir / "pids", "a") as f:
            f.write(f"{name} {proc.pid}\n")
        return proc.pid

    def _start_munge(self) -> None:
        m = self.dir / "munge"
        self._start("munged", [_exe("munged"), "-F", f"--key-file={m / 'munge.key'}",
                               f"--socket={m / 'munge.socket'}", f"--pid-file={m / 'munged.pid'}",
                               f"--log-file={m / 'munged.log'}", f"--seed-file={m / 'munged.seed'}"])
        deadline = time.time() + 10
        while not (m / "munge.socket").exists():
            if time.time() > deadline or not alive(self.pids["munged"]):
                raise RuntimeError("local SLURM: munged did not start: " + self._log_tail("munged"))
            time.sleep(0.05)

    def _write_conf(self) -> None:
        d, host = self.dir, socket.gethostname().split(".")[0]
        ctld_port, *node_ports = _free_ports(1 + len(self.nodes))
        nodes = "\n".join(f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={p} "
                          f"CPUs={self.cpus} State=UNKNOWN" for n, p in zip(self.nodes, node_ports))
        self.conf.write_text(f"""# a local test cluster (tests/slurm/local_cluster.py)
ClusterName=labkittest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge/munge.socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/logs/slurmctld.log
SlurmdLogFile={d}/logs/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
SchedulerType=sched/builtin
JobCompType=jobcomp/filetxt
JobCompLoc={d}/jobcomp.txt
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MinJobAge=600
{nodes}
PartitionName=debug Nodes={",".join(self.nodes)} Default=YES MaxTime=INFINITE State=UP
""")

    def _wait_idle(self, timeout_s: float) -> None:
        deadline = time.time() + timeout_s
        states: dict[str, str] = {}
        while time.time() < deadline:
            for name, pid in self.pids.items():
                if not alive(pid):
                    raise RuntimeError(f"local SLURM: {name} exited: " + self._log_tail(name))
            out = subprocess.run([_exe("sinfo"), "-h", "-N", "-o", "%N %T"], env=self.env,
                                 capture_output=True, text=True)
            states = dict(line.split() for line in out.stdout.splitlines() if line.strip())
            if out.returncode == 0 and all(states.get(n) == "idle" for n in self.nodes):
                return
            time.sleep(0.3)
        raise RuntimeError(f"local SLURM: nodes not idle after {timeout_s:g} s ({states}): "
                           + self._log_tail("slurmctld"))

    def _log_tail(self, name: str) -> str:
        lines = []
        for f in sorted((self.dir / "logs").glob(f"{name}*")) + sorted(self.dir.glob(f"munge/{name}*.log")):
            with contextlib.suppress(OSError):
                lines += f.read_text(errors="replace").splitlines()[-5:]
        return " | ".join(lines) or "(no log)"

    # -- jobs ------------------------------------------------------------------------------
    def submit(self, script: str | os.PathLike, cwd: str | os.PathLike) -> int:
        """``sbatch SCRIPT`` from ``cwd``; the job id."""
        out = subprocess.run([_exe("sbatch"), "--parsable", str(script)], cwd=cwd, env=self.env,
                             capture_output=True, text=True, timeout=30)
        if out.returncode != 0:
            raise RuntimeError(f"sbatch {script}: {out.stderr.strip()}")
        return int(out.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict:
        """``scontrol show job -o`` as a dict (JobState, ExitCode, NodeList, RunTime...)."""
        out = subprocess.run([_exe("scontrol"), "show", "job", "-o", str(job_id)], env=self.env,
                             capture_output=True, text=True, timeout=30)
        return dict(re.findall(r"(\w+)=(\S*)", out.stdout)) if out.returncode == 0 else {}

    def wait(self, job_ids, timeout_s: float = 300.0) -> dict[int, dict]:
        """Wait until every job has ended (or the time is up); each job's last record."""
        deadline, last = time.time() + timeout_s, {}
        while True:
            last = {j: self.job(j) for j in job_ids}
            if all(r.get("JobState") in TERMINAL for r in last.values()) or time.time() > deadline:
                return last
            time.sleep(0.5)

    # -- stop ------------------------------------------------------------------------------
    def stop(self, grace_s: float = 10.0) -> list[int]:
        """Cancel the jobs, stop every daemon by PID (slurmd, slurmctld, munged: SIGTERM, then
        SIGKILL after ``grace_s``), then whatever still carries the marker. The PIDs still
        alive after all that (an empty list: nothing left running)."""
        if self.pids.get("slurmctld") and alive(self.pids["slurmctld"]):
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run([_exe("scancel"), "--full", "--user", str(os.geteuid())],
                               env=self.env, capture_output=True, timeout=15)
        pids = self.pids or _read_pids(self.dir)
        order = sorted(pids, key=lambda n: (n.startswith("slurmctld"), n == "munged"))
        for name in order:  # slurmd first (their controller may still talk to them), munged last
            _terminate([pids[name]], grace_s)
        _terminate(marked(self.dir), grace_s)
        self.pids = {}
        left = [p for p in list(pids.values()) + marked(self.dir) if alive(p)]
        return left

    def __enter__(self) -> LocalSlurm:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _terminate(pids: list[int], grace_s: float) -> None:
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 3.0)):
        live = [p for p in pids if alive(p)]
        for pid in live:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.time() + wait
        while time.time() < deadline and any(alive(p) for p in live):
            time.sleep(0.05)
        for pid in live:  # reap our own children (a zombie is not running, but tidy up)
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)


def _read_pids(folder: Path) -> dict[str, int]:
    pids = {}
    with contextlib.suppress(OSError):
        for line in (folder / "pids").read_text().splitlines():
            name, pid = line.split()
            pids[name] = int(pid)
    return pids


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="a local SLURM for the tests (root, Debian)")
    sub = p.add_subparsers(dest="what", required=True)
    up = sub.add_parser("up", help="start munged, slurmctld and the slurmd nodes in DIR")
    up.add_argument("dir")
    up.add_argument("--nodes", type=int, default=2)
    down = sub.add_parser("down", help="stop every daemon of the cluster in DIR, by PID")
    down.add_argument("dir")
    args = p.parse_args(argv)
    cluster = LocalSlurm(args.dir, nodes=getattr(args, "nodes", 2), tied=False)
    if args.what == "up":
        cluster.start()
        print(f"export SLURM_CONF={cluster.conf}")
        return 0
    left = cluster.stop()
    if left:
        print(f"still running: {left}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
