"""labkit sweep | site | lab: the notebooks, run in batch and published."""

from __future__ import annotations

import sys

from ._common import positive_float


def register(sub) -> None:
    p = sub.add_parser(
        "sweep", help="run a notebook over a parameter grid with papermill",
        description="Run NOTEBOOK for every combination of the --grid values (Python literals; "
                    "bare words only for str parameters), one output folder per point.",
        epilog="example: labkit sweep notebooks/02_speedup.ipynb --grid serial_fraction=0.05,0.2 "
               "--grid \"live_world_sizes=[1, 2],[1, 2, 4]\" --out sweeps/amdahl")
    p.add_argument("notebook", help="the notebook (needs a cell tagged 'parameters')")
    p.add_argument("--grid", action="append", default=[], metavar="NAME=V1,V2",
                   help="a parameter and its values (repeat for more parameters)")
    p.add_argument("-p", "--parameter", action="append", nargs=2, default=[],
                   metavar=("NAME", "VALUE"), help="a fixed parameter (a literal)")
    p.add_argument("-f", "--parameters-file", metavar="YAML", help="fixed parameters from YAML")
    p.add_argument("--out", required=True, metavar="DIR", help="new or empty folder for the points")
    p.add_argument("--cell-timeout", type=positive_float, default=None, metavar="S",
                   help="fail a point whose cell runs longer than S seconds (default: no limit)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("site", help="build the website of the executed notebooks",
                       description="Quarto when `quarto` is on PATH, else a preview site "
                                   "(nbconvert HTML + index, widgets and formulas offline).")
    p.add_argument("--executed", default="_executed", metavar="DIR",
                   help="executed notebooks (labkit lab writes them) (default: %(default)s)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="site folder (default: _site with Quarto, _preview for the preview)")
    p.add_argument("--preview", action="store_true", help="build the preview even if quarto exists")
    p.set_defaults(func=cmd_site)

    p = sub.add_parser("lab", help="run every tutorial notebook with its defaults, then build the site")
    p.add_argument("--only", nargs="+", metavar="NN", help="only these notebooks (number or name prefix)")
    p.add_argument("--executed", default="_executed", metavar="DIR",
                   help="where executed notebooks and their results go (default: %(default)s)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="site folder (default: _site with Quarto, _preview for the preview)")
    p.add_argument("--preview", action="store_true", help="build the preview even if quarto exists")
    p.add_argument("--no-site", action="store_true", help="execute only")
    p.add_argument("--cell-timeout", type=positive_float, default=None, metavar="S",
                   help="fail a notebook whose cell runs longer than S seconds")
    p.set_defaults(func=cmd_lab)


def cmd_sweep(args) -> int:
    from ..sweep import plan, run_sweep, summary

    points = plan(args.notebook, args.grid, args.parameter, args.parameters_file, args.out)
    print(f"{args.notebook}: {len(points)} point(s) into {args.out}", file=sys.stderr)
    rows = run_sweep(args.notebook, points, args.out, progress=not args.no_progress,
                     cell_timeout_s=args.cell_timeout)
    print(summary(rows))
    return 0 if all(r["status"] == "ok" for r in rows) else 1


def _check_site_inputs(args) -> None:
    from ..site import NODE_MODULES, quarto_available

    if (args.preview or not quarto_available()) and not (NODE_MODULES / "@jupyter-widgets").is_dir():
        from ..errors import UsageError

        raise UsageError(f"{NODE_MODULES} is missing: run `npm ci` first (the preview site "
                         "serves the widget renderer, require.js and MathJax from it)")


def cmd_site(args) -> int:
    import time

    from ..site import build_site

    _check_site_inputs(args)
    t0 = time.perf_counter()
    builder, index = build_site(args.executed, args.out, preview=args.preview)
    print(f"{builder} site: {index} ({time.perf_counter() - t0:.1f} s)")
    return 0


def cmd_lab(args) -> int:
    import time

    from ..lab import run_lab, select
    from ..site import build_site

    notebooks = select(args.only)
    if not args.no_site:
        _check_site_inputs(args)  # before an expensive run, not after
    t0 = time.perf_counter()
    rows = run_lab(notebooks, args.executed, cell_timeout_s=args.cell_timeout)
    ran = time.perf_counter() - t0
    failed = [r for r in rows if not r["ok"]]
    for r in rows:
        print(f"{r['notebook']:32s} {'ok' if r['ok'] else 'FAILED':7s} {r['elapsed_s']:7.1f} s")
    print(f"{len(rows) - len(failed)} of {len(rows)} notebook(s) ran in {ran:.1f} s")
    if not args.no_site:
        builder, index = build_site(args.executed, args.out, preview=args.preview)
        print(f"{builder} site: {index}")
    print(f"labkit lab took {time.perf_counter() - t0:.1f} s")
    for r in failed:
        print(f"FAILED {r['error']}", file=sys.stderr)
    return 1 if failed else 0
