"""SLURM batch scripts for multi-node runs (pure: writes text, never submits anything).

The standard multi-node recipe: one task per node (``srun --ntasks-per-node=1``), each task runs
torchrun with R ranks, and all agents meet at a c10d rendezvous on the first node of the
allocation (``--rdzv-backend c10d --rdzv-endpoint HEAD:PORT --rdzv-id $SLURM_JOB_ID``).
A ``labkit ...`` command gets the same settings through its launch flags (``--nnodes``,
``--node-rank``, ``--rdzv-endpoint``, ``--rdzv-id``); a ``python script.py`` or
``python -m module`` command is run by torchrun directly.

* **GPU jobs** (``gpus_per_node`` G >= 1): ``--gres=gpu:G``, R = G ranks per node, one core
  per GPU unless ``cpus_per_task`` says otherwise.
* **CPU jobs** (G = 0): no ``--gres`` line; R = the labkit command's largest ``--nproc`` (or
  ``ranks_per_node``, default 1), one core per rank unless ``cpus_per_task`` says otherwise.
  labkit gives each rank ``SLURM_CPUS_PER_TASK // R`` threads and marks a run oversubscribed
  against the cores the job has (:func:`labkit.procs.allocated_cores`).
* **Environment**: the script puts the scripts folder of the Python environment it was
  written from first on ``PATH`` (an absolute path: the nodes must see it, e.g. on a shared
  filesystem), or runs the ``setup`` line given instead, and checks that the command is there.
  ``srun --export=ALL`` hands it to the tasks even in a job submitted with ``--export=NONE``.
* **Port**: ``port + SLURM_JOB_ID % PORT_SPAN`` (29500 .. 32499 by default, below Linux's
  ephemeral ports), so two jobs that share a node do not meet at one rendezvous.
* **Rows**: only the node that hosts global rank 0 prints tables and writes rows; the other
  nodes print one line saying where they are and exit 0 (``--kill-on-bad-exit`` stays safe).

Cost if the job runs to its time limit: GPU-hours = nodes · G · hours, core-hours = nodes ·
cores per task · hours, and service units SU = (cores + 2 · GPUs) · hours (the rate of UVA's
Rivanna cluster, :func:`labkit.metrics.service_units`).
"""

from __future__ import annotations

import os
import re
import shlex
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

from labkit.errors import UsageError
from labkit.metrics import service_units

_TIME = re.compile(r"^(?:(\d+)-)?(\d{1,3}):([0-5]\d):([0-5]\d)$")
_NAME = re.compile(r"^[\w.\-]+$")
_OWN_FLAGS = ("--nnodes", "--node-rank", "--rdzv-endpoint", "--rdzv-id")

#: the rendezvous port of a job is ``port + SLURM_JOB_ID % PORT_SPAN``
PORT_SPAN = 3000


def parse_walltime(text: str) -> int:
    """Seconds in a SLURM time limit ``HH:MM:SS`` or ``D-HH:MM:SS``.

    >>> parse_walltime("01:30:00"), parse_walltime("1-00:00:00")
    (5400, 86400)
    """
    m = _TIME.match(str(text).strip())
    if not m:
        raise UsageError(f"--time must be HH:MM:SS or D-HH:MM:SS, got {text!r}")
    d, h, mi, s = (int(x or 0) for x in m.groups())
    total = ((d * 24 + h) * 60 + mi) * 60 + s
    if total <= 0:
        raise UsageError(f"--time must be longer than zero, got {text!r}")
    return total


def plural(n: int, word: str) -> str:
    """``1 node``, ``2 nodes``.

    >>> plural(1, "node"), plural(2, "GPU"), plural(0, "core")
    ('1 node', '2 GPUs', '0 cores')
    """
    return f"{n} {word}{'' if n == 1 else 's'}"


def default_bin_dir() -> str:
    """The scripts folder of the running Python environment (where ``labkit`` and ``torchrun``
    are installed), as an absolute path: a venv's ``bin``, never the interpreter it links to."""
    return str(Path(sysconfig.get_path("scripts")).absolute())


def nproc_values(command) -> list[int] | None:
    """The values of ``--nproc`` in a labkit command (None when it has none).

    >>> nproc_values(["labkit", "solve", "--nproc", "1", "2", "--mode", "weak"])
    [1, 2]
    >>> nproc_values(["labkit", "solve", "--nproc=4"]), nproc_values(["labkit", "solve"])
    ([4], None)
    """
    found = None
    args = list(command)
    for i, a in enumerate(args):
        if a == "--nproc":
            vals = []
            for v in args[i + 1:]:
                if v.startswith("-"):
                    break
                vals.append(v)
        elif a.startswith("--nproc="):
            vals = [a.split("=", 1)[1]]
        else:
            continue
        try:
            found = [int(v) for v in vals]  # the last --nproc wins, as in argparse
        except ValueError:
            raise UsageError(f"--nproc takes ranks per node (integers), got {vals}") from None
        if not found or min(found) < 1:
            raise UsageError(f"--nproc takes ranks per node >= 1, got {vals}")
    return found


@dataclass(frozen=True)
class SlurmJob:
    """One batch job: ``nodes`` × ``gpus_per_node`` (0: a CPU job), a time limit, the command.

    ``partition`` / ``account``: only where the cluster needs them. ``cpus_per_task``: cores
    per node (default: one per GPU, or one per rank in a CPU job). ``ranks_per_node``: ranks
    each node starts (default: G; in a CPU job the labkit command's largest ``--nproc``, else
    1). ``setup``: a shell line that makes the environment (``module load ...; source
    .../activate``); without it the script puts ``bin_dir`` (default: this environment's,
    :func:`default_bin_dir`) first on PATH. ``port``: the base of the rendezvous port.
    """

    command: tuple
    nodes: int
    gpus_per_node: int
    time: str
    partition: str | None = None
    account: str | None = None
    cpus_per_task: int | None = None
    job_name: str = "labkit"
    port: int = 29500
    ranks_per_node: int | None = None
    setup: str | None = None
    bin_dir: str | None = None

    def __post_init__(self):
        for name, low in (("nodes", 1), ("gpus_per_node", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise UsageError(f"--{name.replace('_', '-')} must be an integer >= {low}, got {v!r}")
        for name in ("cpus_per_task", "ranks_per_node"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise UsageError(f"--{name.replace('_', '-')} must be an integer >= 1, got {v!r}")
        parse_walltime(self.time)
        for name in ("partition", "account", "job_name"):
            v = getattr(self, name)
            if v is None and name != "job_name":
                continue
            if not _NAME.match(str(v)):
                raise UsageError(f"--{name.replace('_', '-')} must be a plain name (letters, digits, "
                                 f"., -, _), got {v!r}")
        if not (isinstance(self.port, int) and 1024 <= self.port <= 65536 - PORT_SPAN):
            raise UsageError(f"port must be in 1024..{65536 - PORT_SPAN}, got {self.port!r}")
        cmd = tuple(str(c) for c in self.command)
        object.__setattr__(self, "command", cmd)
        if not cmd:
            raise UsageError("give the command to run after --, e.g. -- labkit solve --mode weak "
                             "--dof-per-rank 250000")
        g = self.gpus_per_node
        if cmd[0] == "labkit":
            given = [f for f in _OWN_FLAGS if any(a == f or a.startswith(f + "=") for a in cmd)]
            if given:
                raise UsageError(f"the command sets {', '.join(given)}: labkit slurm sets these "
                                 "from the allocation; leave them out")
            values = nproc_values(cmd)
            if values and self.ranks_per_node not in (None, max(values)):
                raise UsageError(f"the command's --nproc {' '.join(map(str, values))} starts up to "
                                 f"{max(values)} ranks per node, not --ranks-per-node "
                                 f"{self.ranks_per_node}: give one of them")
            ranks = max(values) if values else (self.ranks_per_node or g or 1)
        elif cmd[0] not in ("python", "python3"):
            raise UsageError(f"the command after -- must start with 'labkit' or 'python', got {cmd[0]!r}")
        elif len(cmd) < 2:
            raise UsageError("python needs a script or -m module after it")
        else:
            ranks = self.ranks_per_node or g or 1
        if g and ranks > g:
            raise UsageError(f"{plural(ranks, 'rank')} per node on {plural(g, 'GPU')}: ranks would "
                             "share GPUs; give at most one rank per GPU")
        object.__setattr__(self, "ranks_per_node", ranks)
        if self.cpus_per_task is None:
            object.__setattr__(self, "cpus_per_task", g or ranks)
        if self.setup is not None:
            if self.bin_dir is not None:
                raise UsageError("give a setup line or an environment folder, not both")
            if not str(self.setup).strip() or any(c in str(self.setup) for c in "\n\r\0"):
                raise UsageError(f"--setup must be one non-empty shell line, got {self.setup!r}")
        else:
            bin_dir = self.bin_dir if self.bin_dir is not None else default_bin_dir()
            if not Path(bin_dir).is_absolute() or any(c in bin_dir for c in "\n\r\0"):
                raise UsageError(f"the environment folder must be an absolute path, got {bin_dir!r}")
            object.__setattr__(self, "bin_dir", bin_dir)

    @property
    def walltime_s(self) -> int:
        return parse_walltime(self.time)

    @property
    def gpu(self) -> bool:
        return self.gpus_per_node > 0

    @property
    def labkit_argv(self) -> list[str]:
        """The labkit command as each node runs it (``--nproc R`` added where it had none),
        without the multi-node flags the script adds."""
        cmd = list(self.command)
        if nproc_values(cmd) is None:
            cmd += ["--nproc", str(self.ranks_per_node)]
        return cmd

    def cost(self) -> dict:
        """The most the job can cost: GPU-hours, core-hours and SU at its time limit.

        >>> SlurmJob(("labkit", "env"), 2, 4, "01:00:00", "gpu", "lab").cost()["su"]
        24.0
        >>> c = SlurmJob(("labkit", "solve", "--nproc", "2"), 1, 0, "00:30:00").cost()
        >>> c["gpus"], c["cores"], c["core_hours"], c["su"]
        (0, 2, 1.0, 1.0)
        """
        gpus = self.nodes * self.gpus_per_node
        cores = self.nodes * self.cpus_per_task
        return {"nodes": self.nodes, "ranks_per_node": self.ranks_per_node,
                "ranks": self.nodes * self.ranks_per_node, "gpus": gpus, "cores": cores,
                "walltime_s": self.walltime_s, "gpu_hours": gpus * self.walltime_s / 3600,
                "core_hours": cores * self.walltime_s / 3600,
                "su": service_units(self.walltime_s, cores=cores, gpus=gpus)}

    def shape(self) -> str:
        """``2 nodes x 4 GPUs`` or ``1 node x 2 ranks (CPU)``.

        >>> SlurmJob(("labkit", "solve", "--nproc", "2"), 1, 0, "00:10:00").shape()
        '1 node x 2 ranks (CPU)'
        """
        if self.gpu:
            return f"{plural(self.nodes, 'node')} x {plural(self.gpus_per_node, 'GPU')}"
        return f"{plural(self.nodes, 'node')} x {plural(self.ranks_per_node, 'rank')} (CPU)"

    def cost_line(self) -> str:
        """What ``labkit slurm`` prints: the most the job costs, and its shape.

        >>> SlurmJob(("labkit", "solve", "--nproc", "2"), 1, 0, "00:30:00").cost_line()
        'at most 1.00 core-hours, 1.00 SU (1 node x 2 ranks (CPU), 2 cores per node, 00:30:00)'
        """
        c = self.cost()
        if self.gpu:
            return (f"at most {c['gpu_hours']:.2f} GPU-hours, {c['su']:.2f} SU "
                    f"({self.shape()}, {self.time})")
        return (f"at most {c['core_hours']:.2f} core-hours, {c['su']:.2f} SU ({self.shape()}, "
                f"{plural(self.cpus_per_task, 'core')} per node, {self.time})")

    def run_line(self) -> str:
        """The srun line: torchrun on every node, c10d rendezvous on the first."""
        srun = (f"srun --export=ALL --ntasks-per-node=1 --cpus-per-task={self.cpus_per_task} "
                "--kill-on-bad-exit=1")
        if self.command[0] == "labkit":
            inner = (shlex.join(self.labkit_argv) + ' --nnodes "$SLURM_NNODES" --node-rank "$SLURM_NODEID"'
                     ' --rdzv-endpoint "$RDZV_ENDPOINT" --rdzv-id "$SLURM_JOB_ID"')
            return f"{srun} bash -c {shlex.quote(inner)}"
        target = list(self.command[1:])
        # the first node hosts the rendezvous store by being told so: torch's guess compares
        # the endpoint with its own host names and misses where SLURM's NodeAddr is another
        # interface (or Debian's 127.0.1.1 entry), and then no node hosts it
        inner = (f'torchrun --nnodes "$SLURM_NNODES" --nproc-per-node {self.ranks_per_node} '
                 '--rdzv-backend c10d --rdzv-endpoint "$RDZV_ENDPOINT" --rdzv-id "$SLURM_JOB_ID" '
                 '--rdzv-conf "is_host=$(( SLURM_NODEID == 0 ))" ' + shlex.join(target))
        return f"{srun} bash -c {shlex.quote(inner)}"


def render(job: SlurmJob) -> str:
    """The sbatch script's text (check it with ``bash -n``; submit it with ``sbatch``)."""
    c = job.cost()
    tool = "labkit" if job.command[0] == "labkit" else "torchrun"
    if job.gpu:
        cost = f"{c['gpus']} GPUs x {job.time} = {c['gpu_hours']:.2f} GPU-hours"
    else:
        cost = f"{c['cores']} cores x {job.time} = {c['core_hours']:.2f} core-hours"
    sbatch = [f"--job-name={job.job_name}"]
    sbatch += [f"--account={job.account}"] if job.account else []
    sbatch += [f"--partition={job.partition}"] if job.partition else []
    sbatch += [f"--nodes={job.nodes}", "--ntasks-per-node=1"]
    sbatch += [f"--gres=gpu:{job.gpus_per_node}"] if job.gpu else []
    sbatch += [f"--cpus-per-task={job.cpus_per_task}", f"--time={job.time}",
               f"--output={job.job_name}-%j.out"]
    if job.setup is not None:
        env = f"# the environment, as given to `labkit slurm --setup`\n{job.setup}"
    else:
        env = ("# the environment this script was written from (`labkit slurm --setup LINE` puts\n"
               "# your own line here); every node must see this folder (a shared filesystem)\n"
               f'export PATH={shlex.quote(job.bin_dir)}:"$PATH"')
    if tool == "labkit":
        threads = (f"# threads: labkit gives each of the {job.ranks_per_node} ranks of a node "
                   "SLURM_CPUS_PER_TASK // ranks OMP threads\n# (--threads-per-rank overrides) "
                   "and marks the rows oversubscribed beyond the cores of the job")
    else:
        r = job.ranks_per_node
        threads = ("# threads: the cores of the task shared by its ranks\n"
                   f"export OMP_NUM_THREADS=$(( SLURM_CPUS_PER_TASK / {r} > 0 ? "
                   f"SLURM_CPUS_PER_TASK / {r} : 1 ))")
    lines = "\n".join(f"#SBATCH {s}" for s in sbatch)
    rows = (". Only the node that hosts global rank 0\n# prints tables and writes rows; "
            "the others say where they are and exit 0" if tool == "labkit" else "")
    return f"""#!/bin/bash
# Written by `labkit slurm` on {time.strftime('%Y-%m-%d %H:%M')}; nothing was submitted. Submit: sbatch THIS_FILE
# {job.shape()}. Cost at the time limit: {cost};
#   SU = (cores + 2 x GPUs) x hours = ({c['cores']} + 2 x {c['gpus']}) x {c['walltime_s'] / 3600:.3f} = {c['su']:.2f}
# Output: {job.job_name}-JOBID.out and the command's files, in the folder sbatch was run from.
{lines}

set -eo pipefail

{env}
set -u
command -v {tool} >/dev/null || {{ echo "{tool}: not found on $(hostname): fix the environment lines of this script" >&2; exit 1; }}

# c10d rendezvous on the first node of the allocation (its address as SLURM knows it); the port
# follows the job id, so two jobs sharing a node do not meet at one rendezvous
head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)
head_addr=$(scontrol show node "$head_node" 2>/dev/null | sed -n 's/.*NodeAddr=\\([^ ]*\\).*/\\1/p') || true
export RDZV_ENDPOINT="${{head_addr:-$head_node}}:$(( {job.port} + SLURM_JOB_ID % {PORT_SPAN} ))"
echo "job $SLURM_JOB_ID on $SLURM_JOB_NODELIST, rendezvous $RDZV_ENDPOINT, $(command -v {tool})"

{threads}

# one task per node; each starts torchrun with {plural(job.ranks_per_node, 'rank')}{rows}
{job.run_line()}
"""


def write(job: SlurmJob, path: str | os.PathLike) -> Path:
    """Write the script atomically (executable); the folder must exist."""
    path = Path(path)
    if not path.parent.is_dir():
        raise UsageError(f"--out {path}: folder {path.parent} does not exist")
    if path.is_dir():
        raise UsageError(f"--out {path} is a folder")
    text = render(job)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.chmod(0o755)
    os.replace(tmp, path)
    return path
