"""The result store: upsert, atomic + locked writes, refusal of foreign files, provenance."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from labkit import results
from labkit.errors import ResultsFileError, UsageError

KEY = ("mode", "world_size")


def test_upsert_replaces_rows_with_the_same_key(tmp_path):
    path = tmp_path / "r.json"
    results.upsert(path, [{"mode": "weak", "world_size": 1, "t": 1.0},
                          {"mode": "weak", "world_size": 2, "t": 2.0}], KEY)
    rows = results.upsert(path, [{"mode": "weak", "world_size": 2, "t": 3.0}], KEY)
    assert sorted((r["world_size"], r["t"]) for r in rows) == [(1, 1.0), (2, 3.0)]
    df = results.load(path)
    assert len(df) == 2 and set(df.columns) >= {"mode", "world_size", "t"}


def test_record_adds_provenance_and_nan_becomes_null(tmp_path):
    path = tmp_path / "r.json"
    results.record(path, [{"mode": "x", "world_size": 1, "v": float("nan")}], KEY)
    row = json.loads(path.read_text())["rows"][0]
    for field in ("timestamp", "labkit_version", "torch_version", "hostname", "cores", "git_commit"):
        assert field in row
    assert row["v"] is None


def test_missing_key_field_is_refused(tmp_path):
    with pytest.raises(UsageError, match="upsert key"):
        results.upsert(tmp_path / "r.json", [{"mode": "x"}], KEY)
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("content", ["{not json", '{"rows": []}', "[1, 2, 3]",
                                     '{"format": "labkit-results", "version": 99, "rows": []}'])
def test_corrupt_or_foreign_file_is_an_error_naming_it_and_is_not_touched(tmp_path, content):
    path = tmp_path / "foreign.json"
    path.write_text(content)
    with pytest.raises(ResultsFileError, match="foreign.json"):
        results.upsert(path, [{"mode": "x", "world_size": 1}], KEY)
    with pytest.raises(ResultsFileError, match="foreign.json"):
        results.load(path)
    assert path.read_text() == content


_WRITER = textwrap.dedent("""
    import sys
    from labkit import results
    path, tag, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    pad = "x" * int(sys.argv[4])
    for i in range(n):
        results.upsert(path, [{"writer": tag, "i": i, "pad": pad}], ("writer", "i"))
        print(i, flush=True)
""")


def test_two_concurrent_writers_lose_nothing(tmp_path):
    path = tmp_path / "r.json"
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(path), tag, "200", "10"],
                              stdout=subprocess.DEVNULL) for tag in ("a", "b")]
    for p in procs:
        assert p.wait(timeout=300) == 0
    rows = results.read_rows(path)
    assert len(rows) == 400
    assert {(r["writer"], r["i"]) for r in rows} == {(w, i) for w in "ab" for i in range(200)}


def test_sigkill_mid_write_keeps_every_committed_row(tmp_path):
    path = tmp_path / "r.json"
    # big rows make each write take long enough that kills land inside writes
    for attempt in range(5):
        p = subprocess.Popen([sys.executable, "-c", _WRITER, str(path), f"w{attempt}", "10000",
                              "20000"], stdout=subprocess.PIPE, text=True)
        committed = -1
        deadline = time.time() + 60
        while committed < 5 + attempt * 3 and time.time() < deadline:
            committed = int(p.stdout.readline())
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        rows = results.read_rows(path)  # parses: never a torn file
        mine = {r["i"] for r in rows if r["writer"] == f"w{attempt}"}
        assert set(range(committed + 1)) <= mine
    leftovers = [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]
    # a killed writer may leave its temporary file behind, never a broken results file
    assert all(f.startswith(".r.json.") for f in leftovers)


def test_check_writable_refuses_missing_folder(tmp_path):
    with pytest.raises(ResultsFileError, match="does not exist"):
        results.check_writable(tmp_path / "nope" / "r.json")
