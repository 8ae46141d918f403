"""What the speedup lab's rows hold, and the tables made of them (pure: pandas and numpy only).

Two kinds of rows: a workshare run's (:func:`labkit.speedup.run.run`, one per world size) and a
speedup table's (:func:`labkit.metrics.speedup_table`, one per N, with its summary; what
``labkit speedup --json`` and notebook 02 store). :data:`COLUMNS` declares the fields of both;
:data:`KEY` and :data:`TABLE_KEY` are what their results files upsert by;
:func:`live_speedup` turns a workshare run into a speedup table; :func:`print_workshare` and
:func:`print_speedup` are the tables ``labkit workshare`` and ``labkit speedup`` print.
"""

from __future__ import annotations

from labkit.results import DEVICE_MEMORY_COLUMNS, Column

#: a workshare row is a different measurement of the same point when the world size or the
#: designed serial fraction differ
KEY = ("world_size", "serial_fraction")

#: a speedup-table row (``labkit speedup --json``, notebook 02) is one N of one table
TABLE_KEY = ("world_size",)

COLUMNS = (
    # a workshare run (labkit.speedup.worker)
    Column("time_s", "s", "time of the job at world_size ranks (workshare: p50 over the "
                          "repeats of the slowest rank, launch excluded)"),
    Column("time_min_s", "s", "fastest repeat (slowest rank)"),
    Column("time_cv", "", "coefficient of variation of the repeats"),
    Column("serial_part_s", "s", "rank 0's serial products and the barrier after them (p50)"),
    Column("parallel_part_s", "s", "rank 0's parallel share and the wait for the last rank (p50)"),
    Column("total_work", "", "matrix products in the whole job"),
    Column("serial_fraction", "", "designed share of the products rank 0 does alone"),
    Column("serial_products", "", "products rank 0 does alone"),
    Column("parallel_products_per_rank_max", "", "products of the busiest rank's parallel share"),
    Column("matrix_size", "", "side of the square matrices"),
    Column("repeat", "", "timed runs per launch"),
    Column("timeline_s", "s", "every rank's timed runs segment by segment (run, rank, name, cat, "
                              "start_s, end_s), each run from its first rank's start on one clock"),
    *DEVICE_MEMORY_COLUMNS,
    # a speedup table (labkit.metrics.speedup_table): its rows ...
    Column("speedup", "", "s = t1 / tN"),
    Column("efficiency", "", "E = s / N"),
    Column("relative_su", "", "N / s: what the N-rank job costs against one rank"),
    Column("karp_flatt", "", "e = (1/s - 1/N) / (1 - 1/N), NaN at N = 1"),
    Column("amdahl_speedup", "", "Amdahl's s(N) at the fitted serial fraction"),
    Column("su", "SU", "service units (cores + 2 GPUs) x hours of the N-rank job"),
    # ... and its summary, stored on every row
    Column("amdahl_serial_fraction", "", "serial fraction f of the least-squares Amdahl fit"),
    Column("amdahl_max_speedup", "", "1 / f: the speedup no N exceeds"),
    Column("knee_world_size", "", "largest N whose efficiency is >= knee_threshold"),
    Column("knee_threshold", "", "efficiency below which more ranks waste money"),
    Column("fastest_world_size", "", "the N with the shortest time"),
    Column("designed_serial_fraction", "", "the workshare job's serial_fraction (notebook 02)"),
)

#: the table ``labkit workshare`` prints (and notebook 02 shows) of a workshare run
LIVE_COLUMNS = ("world_size", "time_s", "time_min_s", "time_cv", "oversubscribed",
                "launch_wall_time_s")

#: the speedup table ``labkit workshare`` prints under it
FIT_COLUMNS = ("world_size", "speedup", "efficiency", "relative_su", "karp_flatt")

SPEEDUP_LEGEND = ("speedup s = t1/tN   efficiency E = s/N   relative SU = N/s   "
                  "Karp-Flatt e = (1/s - 1/N)/(1 - 1/N)")


def live_speedup(live, *, threshold: float = 0.5):
    """The speedup table of a workshare run: ``(rows, summary)`` of
    :func:`labkit.metrics.speedup_table` on its times, one core and no GPU per rank (SU).

    Needs the 1-rank row; the speedup is over one core because every rank has one thread.
    """
    from labkit.metrics import speedup_table

    times = dict(zip(live["world_size"].astype(int), live["time_s"].astype(float)))
    return speedup_table(times, cores_per_rank=1, gpus_per_rank=0, threshold=threshold)


def table_rows(rows, summary: dict, **extra) -> list[dict]:
    """A speedup table as the rows a results file stores: each row with the summary (and
    ``extra`` fields) on it."""
    return [{**row, **summary, **extra} for row in rows.to_dict("records")]


def print_workshare(live, serial_fraction: float, file=None) -> None:
    """The run's times; with the 1-rank row and another, the speedup table and the Amdahl fit
    beside the designed serial fraction."""
    from labkit.tables import print_frame

    print_frame(live, LIVE_COLUMNS, file=file)
    if 1 in set(live["world_size"]) and len(live) > 1:
        rows, summary = live_speedup(live)
        print(file=file)
        print_frame(rows, FIT_COLUMNS, file=file)
        print(f"\nAmdahl fit: f = {summary['amdahl_serial_fraction']:.3f} "
              f"(designed {serial_fraction:g})", file=file)


def print_speedup(rows, summary: dict, file=None) -> None:
    """The table ``labkit speedup`` prints: every column of the speedup table, the Amdahl fit
    and the knee."""
    from labkit.tables import print_frame

    print(SPEEDUP_LEGEND, file=file)
    shown = rows.copy()
    for c in ("speedup", "efficiency", "relative_su", "karp_flatt", "amdahl_speedup"):
        shown[c] = shown[c].round(3 if c != "speedup" else 2)
    print_frame(shown, floatfmt="{:g}", file=file)
    f = summary["amdahl_serial_fraction"]
    print(f"\nAmdahl fit (least squares, tN/t1 = f + (1-f)/N): serial fraction f = {f:.4f}, "
          f"max speedup 1/f = {summary['amdahl_max_speedup']:.2f}", file=file)
    print(f"knee: N = {summary['knee_world_size']} is the largest N with efficiency >= "
          f"{summary['knee_threshold']:g}; fastest N = {summary['fastest_world_size']}", file=file)
