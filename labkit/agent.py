"""The agent of a launch: ``python -m labkit.launch ARGS`` (or ``python -m labkit.agent ARGS``)
takes torchrun's arguments and starts the ranks of one node.

One node in the form :func:`labkit.launch.torchrun_command` builds runs under
:func:`light_agent`, which starts the ranks with torchrun's environment without importing
torch itself; several nodes run under torchrun's own main (:func:`torchrun_main`), and
``LABKIT_AGENT=torchrun`` sends one node there too.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from labkit.orphans import die_with_parent


def torchrun_main(argv: list[str] | None = None) -> None:
    """Several nodes (or ``LABKIT_AGENT=torchrun``): ``python -m labkit.launch ARGS`` is
    ``torchrun ARGS``, the same ``torch.distributed.run`` main, arguments and exit codes,
    except that once every rank has finished and torchrun has shut its agent down, it leaves
    with ``os._exit(0)`` instead of letting Python tear down the torch it imported (a fraction
    of a second of every launch, and the lab launches a few dozen times). A failure takes
    torchrun's normal path (its error report, exit code 1). The ranks leave the same way
    (:func:`labkit.harness.worker_main`)."""
    from torch.distributed.run import main

    main(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


#: the only form of ``python -m labkit.launch`` the light agent takes (what
#: :func:`labkit.launch.torchrun_command` builds for one node): anything else goes to torchrun
_LIGHT_ARGS = re.compile(r"--(nproc-per-node=\d+|standalone|log-dir=.+|redirects=3|max-restarts=0)")


def agent_main(argv: list[str] | None = None) -> None:
    """``python -m labkit.launch ARGS``: torchrun's arguments. A one-node ``--standalone``
    launch in the form :func:`labkit.launch.torchrun_command` builds runs under
    :func:`light_agent`; every other form (several nodes, a rendezvous endpoint, options typed
    by hand) and any launch with ``LABKIT_AGENT=torchrun`` in the environment runs under
    torchrun (:func:`torchrun_main`)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    head = argv[: argv.index("-m")] if "-m" in argv else argv
    opts = dict(a[2:].split("=", 1) for a in head if "=" in a)
    # anything else, a hand-typed form included: torchrun's own defaults and checks
    if (os.environ.get("LABKIT_AGENT") == "torchrun" or "--standalone" not in head
            or "-m" not in argv or not all(_LIGHT_ARGS.fullmatch(a) for a in head)
            or "log-dir" not in opts or int(opts.get("nproc-per-node", "0")) < 1):
        torchrun_main(argv)
    sys.exit(light_agent(int(opts["nproc-per-node"]), Path(opts["log-dir"]),
                         argv[len(head) + 1:]))


def light_agent(nproc: int, log_dir: Path, module_args: list[str]) -> int:
    """Start ``nproc`` ranks of ``python -m MODULE ARGS`` on this node and wait for them, the way
    ``torchrun --standalone`` does, without importing torch: the agent's own import of torch
    would be seconds of every launch on a small machine.

    Each rank gets torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
    GROUP_RANK, MASTER_ADDR, MASTER_PORT: rank 0 hosts the store), a session of its own, its
    stdout and stderr in ``log_dir/labkit/attempt_0/<rank>/`` (torchrun's layout) and SIGTERM
    when the agent dies (Linux). When a rank fails, the others get SIGTERM (SIGKILL 5 s later)
    and the agent prints torchrun's lines ``rank : R (local_rank: R)`` / ``exitcode : C``, the
    first failure first, and returns 1; a SIGTERM, SIGINT or SIGHUP to the agent ends every
    rank the same way."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = []
    for rank in range(nproc):
        folder = log_dir / "labkit" / "attempt_0" / str(rank)
        folder.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank),
               "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": "0",
               "GROUP_WORLD_SIZE": "1", "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(nproc),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        # the rank writes through its own copies of the two files: the agent closes its own
        with open(folder / "stdout.log", "wb") as out, open(folder / "stderr.log", "wb") as err:
            procs.append(subprocess.Popen([sys.executable, "-m", *module_args], env=env,
                                          stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                          start_new_session=True,
                                          preexec_fn=die_with_parent(os.getpid())))

    def stop_all(grace_s: float = 5.0) -> None:
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
            for p in procs:
                if p.poll() is None:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(p.pid, sig)
            deadline = time.monotonic() + wait
            while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
                time.sleep(0.02)

    def on_signal(signum, frame):
        stop_all()
        os._exit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    failed: list[int] = []
    while True:
        codes = [p.poll() for p in procs]
        failed += [r for r, c in enumerate(codes) if c not in (None, 0) and r not in failed]
        if failed or all(c == 0 for c in codes):
            break
        time.sleep(0.02)
    if not failed:
        return 0
    stop_all()
    failed += [r for r, p in enumerate(procs) if p.returncode != 0 and r not in failed]
    print("labkit.launch: the launch failed (first observed failure first)", file=sys.stderr)
    for r in failed:
        print(f"  rank      : {r} (local_rank: {r})\n  exitcode  : {procs[r].returncode} "
              f"(pid: {procs[r].pid})", file=sys.stderr)
    return 1


if __name__ == "__main__":
    agent_main()
