"""What the benchmarks that start themselves under torchrun share (a script imports it as
``_common``: the script's folder is first on its path, under torchrun too)."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys


def main_on_ranks(script: str, parser: argparse.ArgumentParser, argv, rank_side, *, env: dict,
                  note: str) -> int:
    """A benchmark's ``main``: ``parser`` (given ``--nproc`` and the hidden ``--rank-side``
    here) parses ``argv``; in a rank (``--rank-side``) ``rank_side(args)`` runs, else
    ``script`` starts itself with the same flags under torchrun on ``--nproc`` ranks of this
    machine, ``env`` added to the environment. The load average is printed before and after
    (the lab machines are shared: a busy neighbour shows there, ``note`` says how the numbers
    stand up to it). The exit status: 0 in a rank, torchrun's here.
    """
    from labkit.procs import available_cores

    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--rank-side", action="store_true", help=argparse.SUPPRESS)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    if args.rank_side:
        rank_side(args)
        return 0
    print(f"load average before: {os.getloadavg()} on {available_cores()} cores ({note})",
          flush=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={args.nproc}", os.path.abspath(script), "--rank-side", *argv]
    rc = subprocess.run(cmd, env={**os.environ, **env}).returncode
    print(f"load average after: {os.getloadavg()}", flush=True)
    return rc


#: seconds -> unit, and the decimals printed
_UNITS = {"ms": (1e3, 3), "us": (1e6, 1)}


def print_side_by_side(samples: dict, per_round_ratios, *, what: str, unit: str,
                       goal: str = "") -> None:
    """Two ways of doing one thing, timed in alternation: the median ``what`` of each, then the
    second over the first, of the medians and round by round (noise that hits a round hits
    both ways alike: the median of the per-round ratios is the steadier number).
    ``samples``: {label: seconds} of the two ways, the reference first; a label's first word
    names its way in the ratio.
    """
    scale, digits = _UNITS[unit]
    width = max(map(len, samples)) + 2
    for label, seconds in samples.items():
        print(f"  {label:<{width}}median {what} {statistics.median(seconds) * scale:9.{digits}f} "
              f"{unit}", flush=True)
    (first, a), (second, b) = samples.items()
    print(f"  ratio {second.split()[0]}/{first.split()[0]}: "
          f"{statistics.median(b) / statistics.median(a):.4f} of the medians; median of "
          f"per-round ratios {statistics.median(per_round_ratios):.4f}{goal}", flush=True)
