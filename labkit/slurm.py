"""SLURM batch scripts for multi-node runs (pure: writes text, never submits anything).

The standard multi-node recipe: one task per node (``srun --ntasks-per-node=1``), each task runs
torchrun with ``--nproc-per-node G``, and all agents meet at a c10d rendezvous on the first node
of the allocation (``--rdzv-backend c10d --rdzv-endpoint HEAD:29500 --rdzv-id $SLURM_JOB_ID``).
A ``labkit ...`` command gets the same settings through its launch flags (``--nnodes``,
``--node-rank``, ``--rdzv-endpoint``, ``--rdzv-id``); a ``python script.py`` or
``python -m module`` command is run by torchrun directly.

Cost if the job runs to its time limit: GPU-hours = nodes · G · hours, and service units
SU = (cores + 2 · GPUs) · hours (the Rivanna rate of seed 001, :func:`labkit.metrics.service_units`).
"""

from __future__ import annotations

import os
import re
import shlex
import time
from dataclasses import dataclass
from pathlib import Path

from .errors import UsageError
from .metrics import service_units

_TIME = re.compile(r"^(?:(\d+)-)?(\d{1,3}):([0-5]\d):([0-5]\d)$")
_NAME = re.compile(r"^[\w.\-]+$")
_OWN_FLAGS = ("--nnodes", "--node-rank", "--rdzv-endpoint", "--rdzv-id")


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


@dataclass(frozen=True)
class SlurmJob:
    """One batch job: ``nodes`` × ``gpus_per_node``, a time limit, and the command to run."""

    command: tuple
    nodes: int
    gpus_per_node: int
    time: str
    partition: str
    account: str
    cpus_per_task: int | None = None  # cores per node; default: one per GPU
    job_name: str = "labkit"
    port: int = 29500

    def __post_init__(self):
        for name in ("nodes", "gpus_per_node"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise UsageError(f"--{name.replace('_', '-')} must be an integer >= 1, got {v!r}")
        if self.cpus_per_task is None:
            object.__setattr__(self, "cpus_per_task", self.gpus_per_node)
        elif not isinstance(self.cpus_per_task, int) or self.cpus_per_task < 1:
            raise UsageError(f"--cpus-per-task must be an integer >= 1, got {self.cpus_per_task!r}")
        parse_walltime(self.time)
        for name in ("partition", "account", "job_name"):
            if not _NAME.match(str(getattr(self, name))):
                raise UsageError(f"--{name.replace('_', '-')} must be a plain name (letters, digits, "
                                 f"., -, _), got {getattr(self, name)!r}")
        if not 1024 <= self.port <= 65535:
            raise UsageError(f"port must be in 1024..65535, got {self.port}")
        cmd = tuple(str(c) for c in self.command)
        object.__setattr__(self, "command", cmd)
        if not cmd:
            raise UsageError("give the command to run after --, e.g. -- labkit solve --mode weak")
        if cmd[0] == "labkit":
            given = [f for f in _OWN_FLAGS if any(a == f or a.startswith(f + "=") for a in cmd)]
            if given:
                raise UsageError(f"the command sets {', '.join(given)}: labkit slurm sets these "
                                 "from the allocation; leave them out")
        elif cmd[0] not in ("python", "python3"):
            raise UsageError(f"the command after -- must start with 'labkit' or 'python', got {cmd[0]!r}")
        elif len(cmd) < 2:
            raise UsageError("python needs a script or -m module after it")

    @property
    def walltime_s(self) -> int:
        return parse_walltime(self.time)

    def cost(self) -> dict:
        """The most the job can cost: GPU-hours and SU at its time limit.

        >>> SlurmJob(("labkit", "env"), 2, 4, "01:00:00", "gpu", "lab").cost()["su"]
        24.0
        """
        gpus = self.nodes * self.gpus_per_node
        return {"nodes": self.nodes, "gpus": gpus, "cores": self.nodes * self.cpus_per_task,
                "walltime_s": self.walltime_s, "gpu_hours": gpus * self.walltime_s / 3600,
                "su": service_units(self.walltime_s, cores=self.nodes * self.cpus_per_task, gpus=gpus)}

    def run_line(self) -> str:
        """The srun line: torchrun on every node, c10d rendezvous on the first."""
        g = self.gpus_per_node
        if self.command[0] == "labkit":
            cmd = list(self.command)
            if "--nproc" not in cmd:
                cmd += ["--nproc", str(g)]
            inner = (shlex.join(cmd) + ' --nnodes "$SLURM_NNODES" --node-rank "$SLURM_NODEID"'
                     ' --rdzv-endpoint "$RDZV_ENDPOINT" --rdzv-id "$SLURM_JOB_ID"')
            return f"srun --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c {shlex.quote(inner)}"
        target = list(self.command[1:])
        return ("srun --ntasks-per-node=1 --kill-on-bad-exit=1 torchrun "
                f'--nnodes "$SLURM_NNODES" --nproc-per-node {g} --rdzv-backend c10d '
                f'--rdzv-endpoint "$RDZV_ENDPOINT" --rdzv-id "$SLURM_JOB_ID" {shlex.join(target)}')


def render(job: SlurmJob) -> str:
    """The sbatch script's text (check it with ``bash -n``; submit it with ``sbatch``)."""
    c = job.cost()
    return f"""#!/bin/bash
# Written by `labkit slurm` on {time.strftime('%Y-%m-%d %H:%M')}; nothing was submitted. Submit: sbatch THIS_FILE
# Cost at the time limit: {c['gpus']} GPUs x {job.time} = {c['gpu_hours']:.2f} GPU-hours;
#   SU = (cores + 2 x GPUs) x hours = ({c['cores']} + 2 x {c['gpus']}) x {c['walltime_s'] / 3600:.3f} = {c['su']:.2f}
#SBATCH --job-name={job.job_name}
#SBATCH --account={job.account}
#SBATCH --partition={job.partition}
#SBATCH --nodes={job.nodes}
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:{job.gpus_per_node}
#SBATCH --cpus-per-task={job.cpus_per_task}
#SBATCH --time={job.time}
#SBATCH --output={job.job_name}-%j.out

set -euo pipefail

# c10d rendezvous on the first node of the allocation: every node's torchrun agent meets there
head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export RDZV_ENDPOINT="${{head_node}}:{job.port}"
export OMP_NUM_THREADS=$(( SLURM_CPUS_PER_TASK / {job.gpus_per_node} > 0 ? SLURM_CPUS_PER_TASK / {job.gpus_per_node} : 1 ))
echo "nodes: $SLURM_JOB_NODELIST, rendezvous: $RDZV_ENDPOINT, job: $SLURM_JOB_ID"

# one task per node; each starts torchrun with {job.gpus_per_node} ranks
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
