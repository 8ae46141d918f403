"""The labkit command line: outputs, exit codes, and that pure commands never import torch."""

import json
import subprocess
import sys

import pytest

RTX = ["1:171", "2:108", "3:79", "4:64", "5:57", "6:52", "7:51", "8:49", "9:49", "10:49"]


def run(args, **kw):
    return subprocess.run([sys.executable, "-m", "labkit.cli", *args], capture_output=True,
                          text=True, timeout=300, **kw)


def test_speedup_prints_the_rtx_table():
    r = run(["speedup", "--times", *RTX])
    assert r.returncode == 0, r.stderr
    row8 = next(line.split() for line in r.stdout.splitlines() if line.split()[:1] == ["8"])
    assert row8[1:5] == ["49", "3.49", "0.436", "2.292"]  # N, time, speedup, efficiency, rel. SU
    assert "knee: N = 6" in r.stdout and "serial fraction f = 0.18" in r.stdout


def test_speedup_answers_without_importing_torch():
    code = ("import sys; from labkit.cli import main; rc = main(['speedup', '--times', '1:10', "
            "'2:6']); assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_speedup_json_rows(tmp_path):
    path = tmp_path / "s.json"
    r = run(["speedup", "--times", "1:226", "2:134", "3:95", "4:76", "--json", str(path)])
    assert r.returncode == 0, r.stderr
    rows = json.loads(path.read_text())["rows"]
    assert [row["world_size"] for row in rows] == [1, 2, 3, 4]
    assert round(rows[3]["speedup"], 2) == 2.97 and "timestamp" in rows[0]


def test_table_describe_gives_each_columns_unit_and_meaning(tmp_path):
    from labkit import results
    from labkit.speedup import report

    path = tmp_path / "s.json"
    assert run(["speedup", "--times", "1:226", "2:134", "--json", str(path)]).returncode == 0
    assert results.undeclared(results.read_rows(path), report.COLUMNS) == []
    r = run(["table", str(path), "--describe"])
    assert r.returncode == 0, r.stderr
    lines = {ln.split()[0]: ln.split(None, 1)[1] for ln in r.stdout.splitlines()[1:]}
    assert set(lines) == set(json.loads(path.read_text())["rows"][0])  # one line per column
    assert lines["su"].startswith("SU ") and lines["time_s"].startswith("s ")
    assert "not declared" not in r.stdout
    r = run(["table", str(path), "--describe", "--columns", "knee_world_size", "--csv"])
    assert r.returncode == 0 and r.stdout.splitlines() == [
        "column,unit,meaning", "knee_world_size,,largest N whose efficiency is >= knee_threshold"]
    results.record(str(path), [{"world_size": 9, "mystery": 1}], key=("world_size",))
    r = run(["table", str(path), "--describe", "--columns", "mystery"])
    assert r.returncode == 0 and "(not declared)" in r.stdout


@pytest.mark.parametrize("args", [
    ["speedup", "--times", "1:10", "2"],
    ["speedup", "--times", "2:10", "4:6"],          # no N = 1
    ["speedup", "--times", "1:10", "2:-1"],
    ["speedup", "--times", "1:10", "--json", "/nonexistent/dir/x.json"],
    ["placement", "--nproc", "0"],
    ["placement", "--nproc", "1", "--timeout", "0"],
    ["table", "/nonexistent.json"],
])
def test_bad_input_exits_2_with_one_line(args):
    r = run(args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    assert len([ln for ln in r.stderr.splitlines() if "error" in ln]) == 1


def test_foreign_results_file_is_refused_and_left_alone(tmp_path):
    path = tmp_path / "foreign.json"
    path.write_text('{"hello": 1}')
    for args in (["table", str(path)], ["speedup", "--times", "1:2", "2:1", "--json", str(path)]):
        r = run(args)
        assert r.returncode == 2 and "foreign.json" in r.stderr and "Traceback" not in r.stderr
    assert path.read_text() == '{"hello": 1}'


@pytest.mark.slow
def test_placement_command_prints_one_line_per_rank_and_stores_rows(tmp_path):
    path = tmp_path / "p.json"
    r = run(["placement", "--nproc", "2", "--allreduce-bytes", "4096", "--json", str(path)])
    assert r.returncode == 0, r.stderr
    assert "world_size 2: placement" in r.stdout and "all-reduce of 4096 B" in r.stdout
    rows = json.loads(path.read_text())["rows"]
    assert sorted(row["rank"] for row in rows) == [0, 1]
    r = run(["table", str(path), "--columns", "rank", "pid", "backend"])
    assert r.returncode == 0 and "gloo" in r.stdout
    from labkit import results
    from labkit.checks import report

    assert results.undeclared(rows, report.COLUMNS) == []


@pytest.mark.slow
def test_transport_check_delivers_every_message_and_its_rows_are_declared():
    from labkit import checks, results
    from labkit.launch import LaunchOptions

    df = checks.transport_check(checks.TransportCheckConfig(rounds=30, repeat=20),
                                launch=LaunchOptions(nprocs=2, threads_per_rank=1, progress=False))
    assert list(df.transport) == ["shm", "torch"] and (df.errors == 0).all()
    assert (df.world_size == 2).all() and (df.exchange_time_p50_s > 0).all()
    assert results.undeclared(df.to_dict("records"), checks.report.COLUMNS) == []


def test_env_reports_backend_and_cores():
    r = run(["env", "--json"])
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["gloo_available"] and info["cores"] >= 1 and info["default_backend_1_rank"] in ("gloo", "nccl")


def test_checks_refuse_bad_configs_before_launching():
    from labkit import checks
    from labkit.errors import UsageError
    from labkit.launch import LaunchOptions

    with pytest.raises(UsageError, match="at least 2|>= 2"):
        checks.transport_check(checks.TransportCheckConfig(), launch=LaunchOptions(nprocs=1))
    with pytest.raises(UsageError, match="allreduce_bytes"):
        checks.PlacementConfig(allreduce_bytes=2)
    with pytest.raises(UsageError, match="PlacementConfig"):
        checks.run({"allreduce_bytes": 4096})
