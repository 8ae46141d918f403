"""What the checks' rows hold, and the tables made of them (pure).

:data:`COLUMNS` declares every field of a placement row (one per rank per launch), of a
transport-check row (one per transport) and of a selftest row; :data:`KEY` is what a results
file of placement rows upserts by; :func:`print_placement` is what ``labkit placement`` prints,
:func:`sharing_problems` the rows it fails on.
"""

from __future__ import annotations

from labkit.results import Column, timed_columns

#: one row per rank of a launch, on one host (``hostname`` is the provenance field of the host
#: that stored it)
KEY = ("world_size", "rank", "hostname")

COLUMNS = (
    # placement (labkit.checks.placement_worker; runtime.placement)
    Column("rank", "", "global rank"),
    Column("local_rank", "", "rank on its node"),
    Column("host", "", "host the rank runs on"),
    Column("pid", "", "process id of the rank"),
    Column("cuda_visible_devices", "", "CUDA_VISIBLE_DEVICES of the rank (None: unset)"),
    Column("threads", "", "torch intra-op threads of the rank"),
    Column("bound_cores", "", "the cores the rank may run on (its share where the launch bound it: "
                        "labkit.procs.bind_to_cores; None where the platform has no mask)"),
    Column("problem", "", "non-empty where the rank shares its GPU with another rank"),
    Column("ready_s", "s", "seconds from the rank's process start to the process group joined "
                           "(importing torch and labkit, the rendezvous)"),
    Column("allreduce_bytes", "bytes", "size of the timed all-reduce"),
    Column("allreduce_correct", "", "an untimed all-reduce of ones summed to world_size, and the "
                                    "timed ones of zeros left zeros (rank 0's buffer)"),
    *timed_columns("allreduce_time", "one all-reduce", each="repeat"),
    Column("allreduce_transfer_s", "s", "one all-reduce: the median of the timed repeats that "
                                        "waited for nothing, slowest rank (the transfer)"),
    # transport check (labkit.checks.transport_worker)
    Column("transport", "", "how messages travelled: shm or torch"),
    Column("rounds", "", "checked rounds (ring exchange + all-reduce)"),
    Column("values", "", "doubles each rank sent per exchange"),
    Column("jitter_us", "us", "longest random wait before a checked round"),
    Column("errors", "", "messages or all-reduces that arrived wrong (must be 0)"),
    Column("note", "", "why a transport asked for did not run on these ranks (empty where it ran)"),
    *timed_columns("exchange_time", "one ring exchange", each="repeat"),
    # selftest (labkit.checks.selftest_worker)
    Column("rank_sum", "", "all-reduced sum of the ranks: N (N - 1) / 2"),
    *timed_columns("step_time", "one step"),
)

#: the placement table ``labkit placement`` prints per world size
PLACEMENT_COLUMNS = ("rank", "local_rank", "host", "pid", "device", "device_name",
                     "cuda_visible_devices", "threads", "bound_cores", "problem")


def sharing_problems(df):
    """Rows of ranks that share a GPU with another rank (``problem`` not empty)."""
    if df.empty or "problem" not in df:
        return df.iloc[:0]
    return df[df["problem"].astype(bool)]


def print_placement(df, file=None) -> None:
    """Per world size: where each rank ran, then the all-reduce's time and its check."""
    from labkit.tables import print_frame

    for n, part in df.groupby("world_size"):
        print(f"\nworld_size {n}: placement", file=file)
        print_frame(part, PLACEMENT_COLUMNS, file=file)
        r = part.iloc[0]
        print(f"all-reduce of {r.allreduce_bytes} B: p50 {r.allreduce_time_p50_s * 1e3:.3f} ms, "
              f"min {r.allreduce_time_min_s * 1e3:.3f} ms (slowest rank), correct: "
              f"{r.allreduce_correct}"
              + ("   [oversubscribed: timings not representative]" if r.oversubscribed else ""),
              file=file)
