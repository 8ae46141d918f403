"""labkit sweep | site | lab | notebook: the notebooks, run in batch, by hand, and published."""

from __future__ import annotations

import argparse
import sys

from labkit.cliargs import positive_float_arg


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
    p.add_argument("--cell-timeout", type=positive_float_arg, default=None, metavar="S",
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
    p.add_argument("--cell-timeout", type=positive_float_arg, default=None, metavar="S",
                   help="fail a notebook whose cell runs longer than S seconds")
    p.set_defaults(func=cmd_lab)

    p = sub.add_parser(
        "report", help="runs of this lab (and other machines') as one HTML and PDF document",
        description="The machines side by side, speedup, efficiency and cost with the request "
                    "the numbers justify, the laws by kind and each lab's key figure, from the "
                    "rows of each RUN; rendered by Quarto (typst PDF), else plain HTML.",
        epilog="example: labkit report _executed --out report")
    p.add_argument("runs", nargs="+", metavar="RUN",
                   help="a `labkit lab` folder (_executed), a results file (*.json) or a "
                        "`labkit sweep` folder")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="new or empty folder (or a report this command wrote) for the report")
    p.add_argument("--pdf", action=argparse.BooleanOptionalAction, default=True,
                   help="render the PDF too (needs Quarto) (default: yes)")
    p.add_argument("--title", default=None, help="the document's title")
    p.add_argument("--reference", action=argparse.BooleanOptionalAction, default=True,
                   help="add the published tables of data/reference as other machines "
                        "(default: yes)")
    p.add_argument("--threshold", type=positive_float_arg, default=0.5, metavar="E",
                   help="the efficiency below which more ranks waste money (default: 0.5)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser(
        "notebook", help="open the tutorials in JupyterLab (the lab's kernel registered)",
        description="JupyterLab of this environment on the tutorials (or on NOTEBOOK). A notebook "
                    "writes its results next to itself, into results/ (git-ignored in notebooks/). "
                    "As root, --allow-root is passed to JupyterLab.")
    p.add_argument("notebook", nargs="?", default=None, metavar="NOTEBOOK",
                   help="a notebook or folder to open (default: notebooks/)")
    p.add_argument("--port", type=int, default=None, help="port (default: JupyterLab's, 8888 or next free)")
    p.add_argument("--ip", default=None, help="address to listen on (default: JupyterLab's, localhost)")
    p.add_argument("--no-browser", action="store_true", help="do not open a web browser")
    p.add_argument("--print-command", action="store_true",
                   help="print the JupyterLab command instead of running it")
    p.set_defaults(func=cmd_notebook)


def cmd_sweep(args) -> int:
    from labkit.book.sweep import plan, run_sweep, summary

    points = plan(args.notebook, args.grid, args.parameter, args.parameters_file, args.out)
    print(f"{args.notebook}: {len(points)} point(s) into {args.out}", file=sys.stderr)
    rows = run_sweep(args.notebook, points, args.out, progress=not args.no_progress,
                     cell_timeout_s=args.cell_timeout)
    print(summary(rows))
    return 0 if all(r["status"] == "ok" for r in rows) else 1


def _check_site_inputs(args) -> None:
    """What a site build needs that is cheap to check: before an expensive run, not after."""
    from pathlib import Path

    from labkit.book.notebooks import REPO_ROOT
    from labkit.book.offline import check_node_modules
    from labkit.book.site import check_out_dir, quarto_available

    quarto = quarto_available() and not args.preview
    check_node_modules(quarto=quarto)
    check_out_dir(Path(args.out or (REPO_ROOT / "_site" if quarto else "_preview")))


def cmd_site(args) -> int:
    import time

    from labkit.book.site import build_site

    _check_site_inputs(args)
    t0 = time.perf_counter()
    builder, index = build_site(args.executed, args.out, preview=args.preview)
    print(f"{built(builder, args.preview)}: {index} ({time.perf_counter() - t0:.1f} s)")
    return 0


def built(builder: str, asked_preview: bool = False) -> str:
    """What `labkit site` / `labkit lab` produced, in words (which builder, and why)."""
    if builder == "quarto":
        return "built the Quarto website"
    why = "--preview" if asked_preview else "Quarto is not on PATH"
    return f"built the preview website ({why})"


def cmd_lab(args) -> int:
    import time

    from labkit.book.lab import run_lab, select
    from labkit.book.site import build_site

    notebooks = select(args.only)
    if not args.no_site:
        _check_site_inputs(args)  # before an expensive run, not after
    t0 = time.perf_counter()
    rows = run_lab(notebooks, args.executed, cell_timeout_s=args.cell_timeout)
    ran = time.perf_counter() - t0
    failed = [r for r in rows if not r["ok"]]
    for r in rows:
        print(f"{r['notebook']:32s} {'ok' if r['ok'] else 'FAILED':7s} {r['elapsed_s']:7.1f} s")
    notebooks_run = [r for r in rows if r["notebook"].endswith(".ipynb")]
    print(f"{sum(r['ok'] for r in notebooks_run)} of {len(notebooks_run)} notebook(s) ran in "
          f"{ran:.1f} s")
    from labkit.book import laws

    table = laws.gather(args.executed)
    if len(table):
        print(f"{laws.counts_sentence(table)} on this machine (the site's front page has "
              f"the table; {args.executed}/*/results/laws.json)")
    from labkit.book.consistency import lab_problems

    contradictions = lab_problems(args.executed)
    print(f"{len(contradictions)} computed sentence(s) contradict the numbers beside them")
    for c in contradictions:
        print(f"  {c['notebook']} cell {c['cell']}: {c['problem']}")
    from labkit.book import drift

    moved = drift.of_run(args.executed)
    if moved is not None:
        print(drift.sentence(moved[0], minutes=moved[1]))
    site_t0 = time.perf_counter()
    if not args.no_site:
        from concurrent.futures import ThreadPoolExecutor

        from labkit.book.report import lab_report
        from labkit.book.site import quarto_available

        # the run as one document (HTML, and a PDF where Quarto is), linked from the front page
        # and made while the site renders (each is one Quarto process: two cores, two jobs);
        # the lab figures are the notebooks' own, so the report does not draw them again
        pdf = quarto_available() and not args.preview
        with ThreadPoolExecutor(1) as pool:
            made = pool.submit(lab_report, args.executed, pdf=pdf, key_figures_too=False)
            report = pool.submit(lambda: made.result()["pdf" if pdf else "html"])
            builder, index = build_site(args.executed, args.out, preview=args.preview,
                                        report=(report, "report.pdf" if pdf else "report.html"))
            print(made.result()["message"])
        print(f"{built(builder, args.preview)}: {index}")
    now = time.perf_counter()
    print(f"labkit lab took {now - t0:.1f} s" + ("" if args.no_site else
          f" (the website and the report {now - site_t0:.1f} s of it)"))
    for r in failed:
        print(f"FAILED {r['error']}", file=sys.stderr)
    return 1 if failed else 0


def cmd_report(args) -> int:
    from labkit.book.report import cmd_report as run

    return run(args)


def cmd_notebook(args) -> int:
    import os
    import shlex

    from labkit.book.kernel import ensure_kernel
    from labkit.book.lab import jupyterlab_command

    if args.port is not None and not 0 < args.port < 65536:
        from labkit.errors import UsageError

        raise UsageError(f"--port must be 1..65535, got {args.port}")
    cmd = jupyterlab_command(args.notebook, port=args.port, ip=args.ip,
                             open_browser=not args.no_browser)
    if args.print_command:
        print(shlex.join(cmd))
        return 0
    try:
        import jupyterlab  # noqa: F401
    except ImportError:
        from labkit.errors import UsageError

        raise UsageError("JupyterLab is not installed in this environment: "
                         "pip install -e \".[notebooks]\" (make setup does)") from None
    print(f"labkit notebook: kernel {ensure_kernel()} registered; starting JupyterLab "
          "(Ctrl-C twice to stop)", file=sys.stderr, flush=True)
    # become JupyterLab: Ctrl-C and signals go to it alone, and its exit status is ours
    os.execv(cmd[0], cmd)
