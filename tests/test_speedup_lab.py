"""The speedup lab (notebook 02): workshare config, plots, the Amdahl explorer, exercise
checks, the labkit-python3 kernelspec, and one small workshare run (slow)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from labkit import metrics, results, speedup
from labkit.book import exercises, kernel
from labkit.cli import main
from labkit.errors import UsageError
from labkit.launch import LaunchOptions
from labkit.speedup import WorkshareConfig

RTX = {1: 171, 2: 108, 3: 79, 4: 64, 5: 57, 6: 52, 7: 51, 8: 49, 9: 49, 10: 49}


@pytest.mark.parametrize("kwargs", [dict(total_work=0), dict(serial_fraction=1.5),
                                    dict(serial_fraction=-0.1), dict(matrix_size=4),
                                    dict(repeat=0), dict(total_work=True)])
def test_workshare_config_refuses_bad_input(kwargs):
    with pytest.raises(UsageError):
        WorkshareConfig(**kwargs)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 7])
def test_workshare_split_covers_the_job_exactly(world_size):
    cfg = WorkshareConfig(total_work=101, serial_fraction=0.13)
    parts = [cfg.split(world_size, r) for r in range(world_size)]
    assert sum(s + p for s, p in parts) == 101
    assert parts[0][0] == round(101 * 0.13) and all(s == 0 for s, _ in parts[1:])
    shares = [p for _, p in parts]
    assert max(shares) - min(shares) <= 1


def test_workshare_command_refuses_before_launching(capsys):
    for args in (["--serial-fraction", "1.5"], ["--nproc", "0"], ["--matrix-size", "2"]):
        try:
            rc = main(["workshare", *args])
        except SystemExit as e:  # argparse's own exit for a bad flag value
            rc = e.code
        assert rc == 2, args
    assert "labkit workshare" in capsys.readouterr().err


def test_plots_and_explorer():
    import matplotlib

    matplotlib.use("Agg")
    from labkit.speedup import plots
    from labkit.speedup.widgets import amdahl_explorer, readout

    rows, summary = metrics.speedup_table(RTX)
    table = pd.concat([rows.assign(source="RTX 2080 Ti")])
    for fig in (plots.speedup_plot(table), plots.efficiency_cost_plot(table),
                plots.karp_flatt_plot(table), plots.laws_plot(0.2, 16, measured=table, mark=8)):
        assert fig.axes and any(ax.lines for ax in fig.axes)
    assert "s(8) = 4.706" in readout(0.1, 8) and "&infin;" in readout(0.0, 4)
    box = amdahl_explorer(table, serial_fraction=0.187, world_size=8, max_world_size=16)
    f_slider, n_slider = box.children[0].children
    text, plot = box.children[1], box.children[2]
    assert "s(8) = 3.4" in text.value  # Amdahl at the RTX fit: 3.47
    assert plot.outputs and "image/png" in plot.outputs[0]["data"]  # drawn before any kernel event
    f_slider.value = 0.0
    assert "s(8) = 8.000" in text.value


@pytest.mark.slow
def test_workshare_run_rows_are_declared_and_stored(tmp_path):
    store = tmp_path / "workshare.json"
    config = WorkshareConfig(total_work=40, serial_fraction=0.25, matrix_size=32, repeat=2)
    live = speedup.run(config, launch=LaunchOptions(nprocs=(1, 2), threads_per_rank=1,
                                                    progress=False), store=store)
    assert list(live.world_size) == [1, 2] and (live.time_s > 0).all()
    assert (live.threads_per_rank == 1).all() and (live.serial_products == 10).all()
    assert live.device_memory_peak_bytes.isna().all()  # gloo on the CPU: no device memory
    # the measured split of each run: both parts timed
    assert (live.serial_part_s > 0).all() and (live.parallel_part_s > 0).all()
    rows = results.read_rows(store)
    assert results.undeclared(rows, speedup.report.COLUMNS) == []
    table, summary = speedup.report.live_speedup(live)
    stored = speedup.report.table_rows(table, summary, designed_serial_fraction=0.25)
    assert results.undeclared(stored, speedup.report.COLUMNS) == []
    speedup.run(config, launch=LaunchOptions(nprocs=2, threads_per_rank=1, progress=False),
                store=store)  # the same point again: replaced, not added
    assert len(results.read_rows(store)) == 2


def test_exercise_check():
    assert exercises.check(None, 2.0) is None
    assert exercises.check(2.29, 8 / 3.49) is True
    assert exercises.check("gloo", "gloo") is True
    with pytest.raises(AssertionError, match="Hint: N / s"):
        exercises.check(3.0, 2.29, hint="N / s")


def test_kernelspec_installed_and_repaired(tmp_path):
    assert kernel.ensure_kernel(str(tmp_path)) == kernel.KERNEL_NAME
    path = kernel.spec_path(str(tmp_path))
    spec = json.loads(path.read_text())
    assert "--IPKernelApp.log_level=ERROR" in spec["argv"]
    path.write_text('{"argv": ["/old/python"]}')
    kernel.ensure_kernel(str(tmp_path))
    assert json.loads(path.read_text()) == kernel.kernel_spec()
