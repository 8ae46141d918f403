"""`labkit report`: runs as one document. Built from small synthetic runs written with
labkit.results (a lab folder, a sweep, a results file) and the published tables of
data/reference; the numbers the document prints are read back from its qmd and HTML and
compared with the rows they came from. The Quarto test renders the HTML and the typst PDF
(skipped, with the reason, where Quarto is not on PATH)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from labkit import metrics, results
from labkit.book import laws
from labkit.book import report as rp
from labkit.book import reportdoc as doc
from labkit.book.site import quarto_available
from labkit.cli import main

HOST = {"hostname": "synth-host", "cores": 8, "torch_version": "9.9.9+test",
        "git_commit": "abc123def456", "timestamp": "2026-01-02T03:04:05+00:00"}
GPU = {"device": "cuda", "device_name": "cuda: Synth GPU", "backend": "nccl"}
# samples/s of DDP at 1, 2, 4 ranks: E = 1, 0.9, 0.475 (the knee at E >= 0.5 is N = 2)
DDP_SAMPLES = {1: 100.0, 2: 180.0, 4: 190.0}
LIVE_TIMES = {1: 4.0, 2: 2.2, 3: 1.9}


def _ddp_rows():
    return [{**HOST, **GPU, "variant": "ddp", "model": "mlp", "batch_size": 32,
             "world_size": n, "samples_per_s": s, "threads_per_rank": 1}
            for n, s in DDP_SAMPLES.items()]


def _live_rows(times=LIVE_TIMES):
    table, summary = metrics.speedup_table(times, cores_per_rank=1, gpus_per_rank=0)
    return [{**HOST, **row, **summary} for row in table.to_dict("records")]


def _law_rows():
    return [{"notebook": "02_speedup", **laws.check("s_2", predicted=1.8, measured=1.82)},
            {"notebook": "05_ddp", **laws.check("t_step", predicted=2.0, measured=1.0,
                                                unit="ms")},
            {"notebook": "05_ddp", **laws.check("s_4 = 4", kind="naive", predicted=4,
                                                measured=1.9)}]


@pytest.fixture(scope="module")
def lab_run(tmp_path_factory) -> Path:
    """A `labkit lab` folder: speedup and DDP rows, laws, lab.json."""
    run = tmp_path_factory.mktemp("synth") / "_executed"
    for sub, name, rows in (("02_speedup", "speedup_live.json", _live_rows()),
                            ("05_ddp", "ddp.json", _ddp_rows()),
                            ("05_ddp", laws.FILE, _law_rows())):
        (run / sub / "results").mkdir(parents=True, exist_ok=True)
        results.record(run / sub / "results" / name, rows)
    (run / "lab.json").write_text(json.dumps({"notebooks": []}))
    return run


@pytest.fixture(scope="module")
def plain_report(lab_run, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("out") / "report"
    made = rp.build_report([lab_run], out, quarto=False)
    assert made["builder"] == "plain" and made["pdf"] is None
    return out


def _unescape(cell: str) -> str:
    return re.sub(r"\\(.)", r"\1", cell.strip())


def qmd_tables(text: str) -> dict[str, list[list[str]]]:
    """Each pipe table of a qmd under the heading before it (cells unescaped)."""
    out, heading, rows = {}, "", []
    for line in [*text.splitlines(), ""]:
        if line.startswith("#"):
            heading = _unescape(line.lstrip("# "))
        if line.startswith("|"):
            if not re.fullmatch(r"\|(-+\|)+", line):
                rows.append([_unescape(c) for c in re.split(r"(?<!\\)\|", line)[1:-1]])
        elif rows:
            key, i = heading, 1
            while key in out:  # a second table under one heading
                i += 1
                key = f"{heading} ({i})"
            out[key] = rows
            rows = []
    return out


class _Cells(HTMLParser):
    def __init__(self):
        super().__init__()
        self.cells, self.imgs, self._in = [], [], False

    def handle_starttag(self, tag, attrs):
        self._in = tag in ("td", "th")
        if tag == "img":
            self.imgs.append(dict(attrs))

    def handle_data(self, data):
        if self._in:
            self.cells.append(data.strip())

    def handle_endtag(self, tag):
        self._in = False


def html_cells(path: Path) -> _Cells:
    p = _Cells()
    p.feed(path.read_text())
    return p


# -- the content equals the rows ------------------------------------------------------------------

def test_machines_side_by_side_come_from_the_rows(plain_report):
    tables = qmd_tables((plain_report / rp.QMD).read_text())
    facts = {row[0]: row[1:] for row in tables["Machines side by side"]}
    here = [c for c in tables["Machines side by side"][0] if "synth-host" in c]
    assert here, tables["Machines side by side"][0]
    col = tables["Machines side by side"][0].index(here[0]) - 1
    assert facts["host"][col] == HOST["hostname"]
    assert facts["cores"][col] == str(HOST["cores"])
    assert facts["GPUs"][col] == str(max(DDP_SAMPLES))  # the largest CUDA world size
    assert facts["backend"][col] == GPU["backend"]
    assert facts["torch"][col] == HOST["torch_version"]
    assert facts["device"][col] == GPU["device_name"]
    # the published machines join with what their YAML states
    assert any("K80" in c for c in tables["Machines side by side"][0])


def test_speedup_table_numbers_equal_the_rows(plain_report):
    tables = qmd_tables((plain_report / rp.QMD).read_text())
    name = next(h for h in tables if "speedup_live.json" in h)
    printed = {int(r[0]): r for r in tables[name][1:]}
    stored = {r["world_size"]: r for r in _live_rows()}
    assert set(printed) == set(stored)
    for n, row in stored.items():
        assert printed[n][1:5] == [doc.fmt(row["time_s"]), doc.fmt(row["speedup"]),
                                   doc.fmt(row["efficiency"]), doc.fmt(row["relative_su"])]
        assert float(printed[n][2]) == pytest.approx(row["speedup"], rel=1e-3)


def test_ddp_series_is_speedup_in_samples_and_its_knee_sets_the_request(plain_report):
    text = (plain_report / rp.QMD).read_text()
    tables = qmd_tables(text)
    name = next(h for h in tables if "DDP mlp, batch 32" in h)
    printed = {int(r[0]): r for r in tables[name][1:]}
    for n, samples in DDP_SAMPLES.items():
        speedup = samples / DDP_SAMPLES[1]
        assert printed[n][2] == doc.fmt(speedup)
        assert printed[n][3] == doc.fmt(speedup / n)
    ns = sorted(DDP_SAMPLES)
    k = metrics.knee(ns, [DDP_SAMPLES[n] / DDP_SAMPLES[1] / n for n in ns], 0.5)
    nxt = ns[ns.index(k) + 1]
    e_next = DDP_SAMPLES[nxt] / DDP_SAMPLES[1] / nxt
    assert (f"Don't request more than {doc.plural(k, 'GPU')}: efficiency E = s/N is "
            f"{doc.fmt(DDP_SAMPLES[k] / DDP_SAMPLES[1] / k)} at N = {k} and {doc.fmt(e_next)} "
            f"at N = {nxt}") in _unescape(text.replace("\\\n", " "))


def test_published_rtx_table_gives_the_guides_own_request(plain_report):
    """The RTX 2080 Ti guide reads its own table as "do not request more than N GPUs": the
    report computes the same N from the numbers."""
    from labkit.perfmodel.catalog import load_reference

    notes = load_reference("ddp_rtx2080ti").attrs["notes"]
    n = int(re.search(r"more than (\d+) GPUs", notes).group(1))
    assert f"Don't request more than {n} GPUs" in _unescape((plain_report / rp.QMD).read_text())


def test_laws_by_kind_counted_from_the_rows(plain_report):
    tables = qmd_tables((plain_report / rp.QMD).read_text())
    counts = next(t for t in tables.values() if t[0] == ["kind", "what it is", "held"])
    rows = _law_rows()
    for c in counts[1:]:
        mine = [r for r in rows if r["kind"] == c[0]]
        assert c[2] == f"{sum(r['holds'] for r in mine)} of {len(mine)}"
    laws_table = next(t for t in tables.values() if t[0][:2] == ["tutorial", "law"])
    assert [r[1] for r in laws_table[1:]] == [r["law"] for r in rows]


def test_fallback_html_says_what_the_qmd_says_with_figures_and_alt_text(plain_report):
    parsed = html_cells(plain_report / rp.HTML)
    qmd_cells = [c for t in qmd_tables((plain_report / rp.QMD).read_text()).values()
                 for row in t for c in row]
    assert [c for c in qmd_cells if c] == [c for c in parsed.cells if c]
    assert len(parsed.imgs) >= 3  # the key figures of two labs and the scaling figures
    for img in parsed.imgs:
        png = plain_report / img["src"]
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert len(img["alt"]) > 40 and ("row(s)" in img["alt"] or "knee N =" in img["alt"])
    assert (plain_report / rp.MARKER).is_file()
    assert not list(plain_report.parent.glob(".report.*"))  # the temporary folder is gone


# -- other runs: a sweep, a results file ----------------------------------------------------------

def test_a_sweep_folder_is_one_run_per_point(tmp_path):
    sweep = tmp_path / "amdahl"
    points = []
    for i, times in enumerate(({1: 3.0, 2: 1.8}, {1: 3.0, 2: 2.9})):
        folder = sweep / f"00{i}_serial_fraction={i}"
        folder.mkdir(parents=True)
        results.record(folder / "speedup_live.json", _live_rows(times))
        (folder / "parameters.json").write_text(json.dumps({"serial_fraction": i}))
        points.append({"point": i, "folder": str(folder), "status": "ok", "elapsed_s": 1.0,
                       "error": None, "parameters": {"serial_fraction": i,
                                                     "results_dir": str(folder)}})
    (sweep / "sweep.json").write_text(json.dumps({"notebook": "x.ipynb", "points": points}))
    out = tmp_path / "out"
    assert main(["report", str(sweep), "--out", str(out), "--no-reference", "--no-pdf"]) == 0
    tables = qmd_tables((out / rp.QMD).read_text())
    head = tables["Machines side by side"][0]
    assert [c for c in head if "amdahl/00" in c] and len(head) == 3  # two points, no reference
    assert tables["Sweep points"][1][1] == "serial_fraction=0"
    second = next(h for h in tables if "serial_fraction=1" in h and "speedup_live" in h)
    assert tables[second][2][2] == doc.fmt(3.0 / 2.9)


def test_a_results_file_is_a_run(tmp_path, capsys):
    path = tmp_path / "ddp.json"
    results.record(path, _ddp_rows())
    out = tmp_path / "out"
    rp_code = main(["report", str(path), "--out", str(out), "--no-reference", "--no-pdf"])
    assert rp_code == 0 and (out / rp.QMD).is_file() and (out / rp.HTML).is_file()
    assert str(out) in capsys.readouterr().out


def test_without_quarto_one_line_says_how_to_get_the_pdf(tmp_path, monkeypatch, capsys, lab_run):
    import labkit.book.site as site

    monkeypatch.setattr(site, "quarto_available", lambda: False)
    assert main(["report", str(lab_run), "--out", str(tmp_path / "r"), "--no-reference"]) == 0
    said = capsys.readouterr().out.strip().splitlines()
    assert len(said) == 1 and "Quarto" in said[0] and "quarto render" in said[0]
    assert not (tmp_path / "r" / rp.PDF).exists()


# -- bad input: one line, exit 2, nothing written -------------------------------------------------

@pytest.mark.parametrize("case", ["missing", "empty_dir", "not_results", "text_file",
                                  "out_is_file", "out_foreign", "out_under_file", "threshold"])
def test_bad_input_is_one_line_and_exit_2_before_writing(case, tmp_path, capsys, lab_run):
    run, out, extra = str(lab_run), tmp_path / "out", []
    if case == "missing":
        run = str(tmp_path / "nope")
    elif case == "empty_dir":
        (tmp_path / "empty").mkdir()
        run = str(tmp_path / "empty")
    elif case == "not_results":
        (tmp_path / "x.json").write_text('{"a": 1}')
        run = str(tmp_path / "x.json")
    elif case == "text_file":
        (tmp_path / "x.txt").write_text("hello")
        run = str(tmp_path / "x.txt")
    elif case == "out_is_file":
        out.write_text("mine")
    elif case == "out_foreign":
        out.mkdir()
        (out / "keep.txt").write_text("mine")
    elif case == "out_under_file":
        (tmp_path / "f").write_text("a file")
        out = tmp_path / "f" / "report"
    elif case == "threshold":
        extra = ["--threshold", "1.5"]
    before = sorted(p.name for p in tmp_path.iterdir())
    code = main(["report", run, "--out", str(out), "--no-reference", "--no-pdf", *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "error" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written
    if case == "out_foreign":
        assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_a_failed_report_leaves_the_previous_one_whole(tmp_path, lab_run, monkeypatch):
    out = tmp_path / "r"
    rp.build_report([lab_run], out, quarto=False, reference=False)
    before = (out / rp.QMD).read_text()

    def broken(*a, **k):
        raise rp.LabkitError("drawing failed")

    monkeypatch.setattr(rp, "document", broken)
    with pytest.raises(rp.LabkitError):
        rp.build_report([lab_run], out, quarto=False, reference=False)
    assert (out / rp.QMD).read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]  # no temporary folder left


def test_the_real_lab_run_if_there_is_one(tmp_path):
    """The repository's own `make lab` run, when one is there (a fresh clone has none)."""
    from labkit.book.notebooks import REPO_ROOT

    real = REPO_ROOT / "_executed"
    if not any(real.glob("*/results/*.json")):
        pytest.skip("no `make lab` run in _executed/ (make lab makes one)")
    made = rp.build_report([real], tmp_path / "r", quarto=False, reference=False)
    text = (made["qmd"]).read_text()
    tables = qmd_tables(text)
    live = results.read_rows(real / "02_speedup" / "results" / "speedup_live.json")
    name = next(h for h in tables if "speedup_live.json" in h)
    assert [r[2] for r in tables[name][1:]] == [doc.fmt(r["speedup"]) for r in
                                                sorted(live, key=lambda r: r["world_size"])]
    assert len(html_cells(made["html"]).imgs) >= 5


# -- Quarto: HTML and the typst PDF ---------------------------------------------------------------

def _first_page_png(pdf: Path, tmp: Path) -> bytes | None:
    """The PDF's first page as PNG: pdftoppm, else pypdfium2; None where neither exists."""
    if shutil.which("pdftoppm"):
        subprocess.run(["pdftoppm", "-png", "-r", "40", "-f", "1", "-l", "1", str(pdf),
                        str(tmp / "page")], check=True, timeout=120)
        return next(tmp.glob("page*.png")).read_bytes()
    try:
        import pypdfium2
    except ImportError:
        return None
    page = pypdfium2.PdfDocument(str(pdf))[0]
    page.render(scale=0.5).to_pil().save(tmp / "page.png")
    return (tmp / "page.png").read_bytes()


@pytest.mark.quarto
@pytest.mark.skipif(not quarto_available(), reason="needs Quarto on PATH (.ci/run installs it)")
def test_quarto_renders_the_html_and_the_typst_pdf(lab_run, tmp_path):
    made = rp.build_report([lab_run], tmp_path / "r", title="Synthetic run")
    assert made["builder"] == "quarto"
    pdf = made["pdf"].read_bytes()
    assert pdf.startswith(b"%PDF") and pdf.rstrip().endswith(b"%%EOF")
    assert len(re.findall(rb"/Type\s*/Page\b(?!s)", pdf)) >= 2  # pages, not the page tree
    png = _first_page_png(made["pdf"], tmp_path)
    if png is not None:
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 2000
    page = made["html"].read_text()
    assert not re.search(r'(src|href)="https?://', page)  # self-contained, offline
    # Quarto's minimal HTML with the plain report's style: no Bootstrap theme compiled
    assert doc._STYLE.splitlines()[0] in page and "bootstrap" not in page.lower()
    cells = html_cells(made["html"])
    assert doc.fmt(DDP_SAMPLES[2] / DDP_SAMPLES[1]) in cells.cells
    assert all(img.get("alt") for img in cells.imgs) and len(cells.imgs) >= 3
    assert sorted(p.name for p in made["out"].iterdir()) == sorted(
        [rp.MARKER, "figures", rp.HTML, rp.PDF, rp.QMD])
