"""Host side: runs of this lab, and of other machines, as one document (``labkit report``).

::

    labkit report _executed --out report            # a `labkit lab` run
    labkit report sweeps/amdahl results/ddp.json --out cmp --no-pdf

A RUN is a ``labkit lab`` folder (``_executed``), a results file (``*.json`` of rows), a folder
of results files, or a ``labkit sweep`` folder (one run per point); the published tables of
``data/reference`` join as runs of other machines (``reference=False`` leaves them out). The
document (:mod:`labkit.book.reportdoc`) has the machines side by side, speedup, efficiency and
cost per resource with the request the numbers justify, each run's laws by kind, and each lab's
key figure drawn by that lab's ``plots`` from the rows, as PNG with alt text.

``DIR/report.qmd`` is rendered by Quarto into ``DIR/report.html`` (self-contained) and
``DIR/report.pdf`` (typst). Without Quarto on PATH the same content is written as plain HTML,
and one line says how to get the PDF. Everything is checked before anything is written, and
the folder is built aside and swapped in whole: a failure leaves the previous report as it was.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from labkit.book import reportdoc as doc
from labkit.errors import LabkitError, ResultsFileError, UsageError

MARKER = ".labkit-report"
QMD, HTML, PDF = "report.qmd", "report.html", "report.pdf"
#: where ``make lab`` puts the report of its own run, inside the run's folder
LAB_REPORT_DIR = "report"
DEFAULT_THRESHOLD = 0.5
QUARTO_TIMEOUT_S = 600

#: results file -> (plots module, function, what the figure shows, columns whose values the
#: alt text lists): each lab's key figure, drawn from its rows
KEY_FIGURES = {
    "placement.json": ("labkit.checks.plots", "launch_cost_plot",
                       "Two bar charts per world size: one launch's wall time and one "
                       "all-reduce's p50", ("world_size",)),
    "speedup_live.json": ("labkit.speedup.plots", "speedup_plot",
                          "Speedup of the workshare job against ranks, with s = N dashed and "
                          "the Amdahl fit dotted", ("world_size",)),
    "solve_scaling.json": ("labkit.solve.plots", "scaling_figure",
                           "Three panels against ranks: weak-scaling solve time, strong-scaling "
                           "speedup, throughput in DOF/s, each with its ideal dashed",
                           ("mode", "world_size")),
    "solve_memory.json": ("labkit.solve.plots", "time_split_figure",
                          "Stacked bars: milliseconds per iteration in SpMV, halo exchange, "
                          "all-reduce, vector updates and the rest", ("world_size",)),
    "ddp.json": ("labkit.ddp.plots", "throughput_vs_world_size",
                 "Samples/s against world size, one panel per batch per rank: DDP, the ideal "
                 "N x 1-rank line and the no-DDP baselines", ("batch_size", "world_size")),
    "collectives.json": ("labkit.collectives.plots", "busbw_vs_size",
                         "Bus bandwidth and time per call against message size per collective, "
                         "with the alpha-beta model", ("op", "world_size")),
    "pipeline.json": ("labkit.pipeline.plots", "bubble_vs_microbatches",
                      "The fill/drain bubble, the step and each stage's compute against "
                      "microbatches, per schedule", ("schedule", "num_stages")),
    "layout_search.json": ("labkit.perfmodel.plots", "layout_search_plot",
                           "The best DP x TP x PP layouts as stacked bars of predicted seconds "
                           "per step", ("world_size",)),
    "fsdp.json": ("labkit.fsdp.plots", "memory_and_comm",
                  "Per variant: bytes held per rank, bytes moved per step and the step time, "
                  "each beside its formula", ("variant", "world_size")),
    "tp.json": ("labkit.tp.plots", "step_breakdown",
                "Per variant and world size: the measured step and its prediction as stacked "
                "bars", ("variant", "world_size")),
}


# -- runs ---------------------------------------------------------------------------------------

def _results_files(paths) -> dict[str, list[dict]]:
    """The labkit results files among ``paths`` (other JSON, such as sweep.json, skipped)."""
    from labkit import results

    out = {}
    for name, path in paths:
        try:
            rows = results.read_rows(path)
        except ResultsFileError:
            continue
        if rows:
            out[name] = rows
    return out


def _split_laws(tables: dict) -> tuple[dict, list]:
    from labkit.book import laws

    found = [r for name, rows in tables.items() if Path(name).name == laws.FILE for r in rows]
    return {k: v for k, v in tables.items() if Path(k).name != laws.FILE}, found


def _folder_run(folder: Path, label: str, kind: str, extra=()) -> doc.Run | None:
    files = [(p.name, p) for p in sorted(folder.glob("*.json"))] + list(extra)
    tables, law_rows = _split_laws(_results_files(files))
    if not tables and not law_rows:
        return None
    return doc.Run(label, kind, str(folder), tables, law_rows)


def _profile_file(folder: Path) -> list:
    from labkit.machine.profile import FILE

    return [(FILE, folder / FILE)] if (folder / FILE).is_file() else []


def load_run(path) -> list[doc.Run]:
    """The runs in ``path``; a path that is none is a :class:`UsageError` (one line)."""
    p = Path(path)
    if not p.exists():
        raise UsageError(f"{p}: no such file or folder")
    if p.is_file():
        if p.suffix != ".json":
            raise UsageError(f"{p}: not a run (a results file *.json, a `labkit lab` folder "
                             "or a `labkit sweep` folder)")
        from labkit import results

        rows = results.read_rows(p)  # not a results file: ResultsFileError, one line
        if not rows:
            raise UsageError(f"{p}: a results file with no rows")
        tables, law_rows = _split_laws({p.name: rows})
        return [_named(doc.Run(p.stem, "results file", str(p), tables, law_rows))]
    if (p / "sweep.json").is_file():
        return _sweep_runs(p)
    run = None
    if (p / "lab.json").is_file() or any(p.glob("*/results/*.json")):
        files = [(f"{f.parent.parent.name}/{f.name}", f) for f in sorted(p.glob("*/results/*.json"))]
        run = _folder_run(p, p.resolve().name, "lab run", [*files, *_profile_file(p)])
    run = run or _folder_run(p, p.resolve().name, "results folder")
    if run is None:
        raise UsageError(f"{p}: not a run (no lab.json or */results/*.json of `labkit lab`, no "
                         "sweep.json of `labkit sweep`, no labkit results file)")
    return [_named(run)]


def _named(run: doc.Run) -> doc.Run:
    """A run's label: its host, then its folder or file (a figure legend hides a label that
    starts with "_", such as ``_executed``)."""
    hosts = doc.distinct([r for rows in run.tables.values() for r in rows], "hostname")
    if len(hosts) == 1:
        run.label = f"{hosts[0]} ({run.label})"
    return run


def _sweep_runs(folder: Path) -> list[doc.Run]:
    try:
        sweep = json.loads((folder / "sweep.json").read_text())
        points = sweep["points"]
    except (OSError, ValueError, KeyError, TypeError):
        raise UsageError(f"{folder}/sweep.json: not a `labkit sweep` record") from None
    runs = []
    for point in points:
        here = folder / Path(str(point.get("folder", ""))).name  # the sweep may have moved
        run = _folder_run(here, f"{folder.resolve().name}/{here.name}", "sweep point",
                          _profile_file(folder)) if here.is_dir() else None
        if run is not None:
            run.parameters = {k: v for k, v in (point.get("parameters") or {}).items()
                              if k != "results_dir"}
            runs.append(_named(run))
    if not runs:
        raise UsageError(f"{folder}: a sweep with no point that stored rows")
    return runs


def _stated(pattern: str, *texts) -> str:
    for text in texts:
        m = re.search(pattern, str(text or ""))
        if m:
            return m.group(1)
    return "not stated"


def reference_runs() -> list[doc.Run]:
    """The published tables of ``data/reference`` that are runs of a machine (world sizes and
    times), each with the facts its YAML states."""
    from labkit.perfmodel.catalog import load_reference, reference_names

    runs = []
    for name in reference_names():
        df = load_reference(name)
        if not doc.series_of_reference(name, df):
            continue  # not a machine's timings (an engine comparison)
        a = df.attrs
        top = df.loc[df["world_size"].idxmax()]
        gpus = str(int(top["world_size"]))
        if "nnodes" in df and "gpus_per_node" in df:
            gpus += f" ({int(top['nnodes'])} nodes x {int(top['gpus_per_node'])})"
        device = ", ".join(sorted(set(df["accelerator"]))) if "accelerator" in df \
            else _stated(r"(\b[A-Z]+\d+\w*\b)", a.get("title"))
        facts = {"host": "not stated (published)", "cores": "not stated", "device": device,
                 "backend": _stated(r"backend (\w+)", a.get("notes")),
                 "torch": _stated(r"PyTorch (\d[\w.+]*\w)", a.get("notes"), a.get("title")),
                 "GPUs": gpus, "measured": "published", "rows": str(len(df))}
        label = f"{device} (published)"
        runs.append(doc.Run(label, "published", str(a.get("source", name)), facts=facts,
                            reference=df))
    return runs


# -- checks before writing ------------------------------------------------------------------------

def check_out(out) -> Path:
    """``out`` as a folder this command may fill: absent, empty, or a report it made before,
    under a folder it can write."""
    out = Path(out).resolve()
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file, not a folder")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).exists():
        raise UsageError(f"--out {out} exists and was not made by labkit report; pick another "
                         "folder (or remove it)")
    parent = out.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"--out {out}: {parent} is not a writable folder")
    return out


# -- figures --------------------------------------------------------------------------------------

def _alt(what: str, name: str, rows: list[dict], facets) -> str:
    parts = []
    for col in facets:
        values = doc.distinct(rows, col)
        if values:
            parts.append(f"{col} {', '.join(values)}")
    return f"{what}; drawn from the {len(rows)} row(s) of {name}" + (
        f" ({'; '.join(parts)})" if parts else "") + "."


def _draw(func, df, name: str, label: str):
    if name == "speedup_live.json":
        return func(df.assign(source=label), title="Live: speedup of the workshare job")
    return func(df)


def key_figures(run: doc.Run, folder: Path, prefix: str) -> list[tuple]:
    """Blocks of a run's key figures, drawn by each lab's plots from the rows into ``folder``.
    A figure its rows cannot make (a partial sweep point) is a sentence saying why."""
    import matplotlib.pyplot as plt
    import pandas as pd

    from labkit.figures import save

    blocks = []
    for name, rows in run.tables.items():
        entry = KEY_FIGURES.get(Path(name).name)
        if entry is None:
            continue
        module, function, what, facets = entry
        png = f"{prefix}_{Path(name).stem}.png"
        try:
            fig = _draw(getattr(importlib.import_module(module), function), pd.DataFrame(rows),
                        Path(name).name, run.label)
        except (KeyError, ValueError, TypeError, IndexError, AttributeError, LabkitError) as e:
            blocks.append(("p", f"{name}: no figure from these rows ({type(e).__name__}: {e})."))
            continue
        try:
            save(fig, folder / png, dpi=110)
        finally:
            plt.close(fig)
        blocks.append(("figure", f"figures/{png}", _alt(what, name, rows, facets),
                       f"{run.label}: {name} ({module}.{function})"))
    return blocks


def scaling_figure(run: doc.Run, series: list[dict], folder: Path, png: str,
                   threshold: float) -> tuple:
    """A run's series side by side: efficiency with the threshold and each knee, and cost N/s
    (the speedup lab's figure, one curve per series)."""
    import matplotlib.pyplot as plt
    import pandas as pd

    from labkit.figures import save
    from labkit.speedup import plots

    frame = pd.concat([s["table"].assign(source=s["name"]) for s in series], ignore_index=True)
    fig = plots.efficiency_cost_plot(frame, threshold=threshold)
    try:
        save(fig, folder / png, dpi=110)
    finally:
        plt.close(fig)
    knees = "; ".join(f"{s['name']}: knee N = {int(s['summary']['knee_world_size'])}"
                      for s in series)
    alt = (f"Left: efficiency E = s/N against N (N = "
           f"{', '.join(str(n) for n in sorted(set(frame.world_size)))}) with the threshold "
           f"{doc.fmt(threshold)} dashed and each knee boxed; right: cost N/s against N, 1 "
           f"dashed. {knees}.")
    return ("figure", f"figures/{png}", alt, f"{run.label}: efficiency and cost per series")


# -- the document ---------------------------------------------------------------------------------

def _series_of(run: doc.Run) -> list[dict]:
    if run.reference is not None:
        name = Path(str(run.reference.attrs.get("name", run.label))).name
        return doc.series_of_reference(name, run.reference)
    return [s for name, rows in run.tables.items() for s in doc.series_of_rows(name, rows)]


def scaling_section(runs: list[doc.Run], folder: Path, threshold: float) -> list[tuple]:
    from labkit.metrics import speedup_table

    blocks = [("h", 2, "Speedup, efficiency and cost per resource"),
              ("p", f"Speedup s = t1/tN, efficiency E = s/N, cost N/s (the resource-time of N "
                    f"against one; 1 is perfect scaling) and service units SU = (cores + 2 GPUs)"
                    f" x hours of the job. The knee is the largest N whose efficiency is at "
                    f"least the threshold E = {doc.fmt(threshold)}.")]
    for i, run in enumerate(runs):
        drawn = []
        for s in _series_of(run):
            label = f"{run.label}: {s['name']}"
            blocks.append(("h", 3, f"{label} ({s['file']})"))
            if 1 not in s["times"] or len(s["times"]) < 2:
                blocks.append(("p", f"No scaling read: {s['file']} has "
                                    f"{doc.plural(len(s['times']), 'world size')} "
                                    f"({', '.join(map(str, s['times'])) or 'none'}); speedup "
                                    "needs N = 1 and another."))
                continue
            table, summary = speedup_table(s["times"], cores_per_rank=s["cores_per_rank"],
                                           gpus_per_rank=s["gpus_per_rank"], threshold=threshold)
            blocks += [("p", f"{s['scaling'].capitalize()} scaling, from {s['file']}; time is "
                             f"the {s['time']} in s; a rank is one {s['resource']}."),
                       ("table", list(doc.SCALING_HEAD), doc.scaling_rows(table, s["scaling"])),
                       ("p", doc.recommendation(table, summary, s["resource"]))]
            drawn.append({**s, "table": table, "summary": summary})
        if drawn:
            blocks.append(scaling_figure(run, drawn, folder, f"scaling{i}.png", threshold))
    if not any(b[0] == "table" for b in blocks):
        blocks.append(("p", "No run has speedup or DDP rows with N = 1 and another N."))
    return blocks


def laws_section(runs: list[doc.Run]) -> list[tuple]:
    import pandas as pd

    from labkit.book import drift, laws

    blocks = [("h", 2, "How well each law held, by kind")]
    with_laws = [r for r in runs if r.laws]
    for run in with_laws:
        table = pd.DataFrame(run.laws)
        if "kind" not in table:
            table["kind"] = "model"
        table = table.sort_values("notebook", kind="stable") if "notebook" in table else table
        blocks += [("h", 3, run.label), ("p", laws.counts_sentence(table) + "."),
                   ("md_table", laws.counts_markdown(table))]
        moved = drift.of_run(run.where) if run.kind == "lab run" else None
        if moved is not None:  # the machine measured again at the run's end
            blocks += [("p", drift.sentence(moved[0], minutes=moved[1])),
                       ("md_table", drift.markdown(moved[0]))]
        blocks.append(("md_table", laws.markdown(table)))
    if not with_laws:
        blocks.append(("p", "No laws.json among these runs."))
    return blocks


def document(runs: list[doc.Run], folder: Path, *, threshold: float,
             key_figures_too: bool = True) -> list[tuple]:
    """The report's blocks; its figures are drawn into ``folder``/figures (each lab's key
    figure only with ``key_figures_too``: they cost a second or two each)."""
    (folder / "figures").mkdir(parents=True, exist_ok=True)
    own = [r for r in runs if r.kind != "published"]
    head, rows = doc.machines_table(runs)
    blocks = [("p", f"{doc.plural(len(own), 'run')} of this lab and "
                    f"{doc.plural(len(runs) - len(own), 'published table')} of other machines. "
                    "Every number below is read or computed from the rows of the files named "
                    "in the last row of the machines table."),
              ("h", 2, "Machines side by side"), ("table", head, rows)]
    swept = [r for r in own if r.parameters]
    if swept:
        blocks += [("h", 3, "Sweep points"),
                   ("table", ["point", "parameters"],
                    [[r.label, ", ".join(f"{k}={v}" for k, v in r.parameters.items())]
                     for r in swept])]
    blocks += scaling_section(runs, folder / "figures", threshold)
    blocks += laws_section(own)
    if not key_figures_too:
        return blocks
    blocks.append(("h", 2, "Key figures"))
    for i, run in enumerate(own):
        figs = key_figures(run, folder / "figures", f"run{i}")
        blocks += [("h", 3, run.label), *figs] if figs else []
    return blocks


# -- rendering ------------------------------------------------------------------------------------

def render(folder: Path, *, pdf: bool) -> None:
    """``quarto render`` of ``folder/report.qmd``: HTML and, with ``pdf``, the typst PDF."""
    from labkit.book.site import quarto_failure, quarto_path

    cmd = [quarto_path(), "render", QMD] + ([] if pdf else ["--to", "html"])
    try:
        proc = subprocess.run(cmd, cwd=folder, capture_output=True, text=True, errors="replace",
                              stdin=subprocess.DEVNULL, timeout=QUARTO_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise LabkitError(f"quarto render ran past {QUARTO_TIMEOUT_S} s") from None
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise LabkitError(quarto_failure(output, proc.returncode))
    for made in [HTML] + ([PDF] if pdf else []):
        if not (folder / made).is_file():
            raise LabkitError(f"quarto render wrote no {made} ({output[-300:].strip()})")


def _swap_in(tmp: Path, out: Path) -> None:
    (tmp / MARKER).write_text("written by labkit report; replaced on the next report\n")
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # a folder like any other, not mkdtemp's private one
    old = None
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
        os.replace(out, old / "report")
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def build_report(paths, out, *, pdf: bool = True, title: str | None = None,
                 reference: bool = True, threshold: float = DEFAULT_THRESHOLD,
                 quarto: bool | None = None, key_figures_too: bool = True) -> dict:
    """Write the report of the runs in ``paths`` to ``out``; what was made.

    ``quarto``: render with Quarto (default: when it is on PATH). Returns ``{"out", "qmd",
    "html", "pdf" (None if not made), "builder", "message"}``."""
    from labkit.book.site import quarto_available

    if not paths:
        raise UsageError("no RUN given: a `labkit lab` folder, a results file or a sweep folder")
    if not 0 < threshold <= 1:
        raise UsageError(f"--threshold must be in (0, 1], got {threshold:g}")
    runs = [run for p in paths for run in load_run(p)]
    out = check_out(out)
    seen: dict[str, int] = {}
    for run in runs:  # one column per run: the same folder name twice gets a number
        seen[run.label] = seen.get(run.label, 0) + 1
        if seen[run.label] > 1:
            run.label += f" ({seen[run.label]})"
    runs += reference_runs() if reference else []
    title = title or "Scaling Lab report: " + ", ".join(r.label for r in runs
                                                        if r.kind != "published")
    quarto = quarto_available() if quarto is None else quarto
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        blocks = document(runs, tmp, threshold=threshold, key_figures_too=key_figures_too)
        (tmp / QMD).write_text(doc.to_qmd(blocks, title=title, pdf=pdf), encoding="utf-8")
        if quarto:
            render(tmp, pdf=pdf)
            for extra in tmp.iterdir():  # Quarto's working files
                if extra.name not in (QMD, HTML, PDF, "figures"):
                    shutil.rmtree(extra) if extra.is_dir() else extra.unlink()
        else:
            (tmp / HTML).write_text(doc.to_html(blocks, title=title), encoding="utf-8")
        _swap_in(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    made_pdf = out / PDF if quarto and pdf else None
    if quarto:
        message = f"wrote {out / HTML}" + (f" and {made_pdf}" if made_pdf else "")
    else:
        message = (f"wrote {out / QMD} and {out / HTML} (plain HTML: Quarto is not on PATH; for "
                   f"the PDF install Quarto and run `quarto render {out / QMD}`)")
    return {"out": out, "qmd": out / QMD, "html": out / HTML, "pdf": made_pdf,
            "builder": "quarto" if quarto else "plain", "message": message}


def lab_report(executed_dir, *, pdf: bool = True, key_figures_too: bool = True) -> dict:
    """The report of a ``labkit lab`` run, into its own folder (``executed_dir/report``)."""
    return build_report([executed_dir], Path(executed_dir) / LAB_REPORT_DIR, pdf=pdf,
                        key_figures_too=key_figures_too)


def cmd_report(args) -> int:
    made = build_report(args.runs, args.out, pdf=args.pdf, title=args.title,
                        reference=args.reference, threshold=args.threshold)
    print(made["message"], file=sys.stdout)
    return 0
