"""Notebook 08's live pipeline rows priced by notebook 07's step model (pure: no torch).

The replay (:func:`labkit.pipeline.report.add_model`) places each block at its time alone, as
the launch's own timelines show it (``block_times``: the blocks that ran while no other rank
computed), in the schedule's order, with the profile's co-run slowdown where ranks compute at
once, each message's transfer and counted wait where it lies, and the schedule's own work
between blocks and at the step's edges, read off the launch's timelines. Why it, not
:func:`labkit.perfmodel.modelcheck.pipeline_terms`: in 22 live launches of 08's pipeline on
the 2-vCPU VM the replay's step held within 25 % in 43 of 44 steps and its bubble share within
0.05 in 43, the closed form's in 27 and 35 (``docs/measurements.md``; measured before the
replay put the schedule's gap beside each message too).
"""

from __future__ import annotations

from labkit.book.laws import given

#: what a step row of the check keeps of the replay's columns
REPLAY_COLUMNS = ("corun_slowdown", "message_transfer_s", "schedule_gap_s", "step_edges_s",
                  "step_waits_model_s", "step_waits_measured_s")


def replayable(row: dict) -> bool:
    """Whether a pipeline row holds what the replay reads: its blocks' times
    (``block_times``), its median step's blocks and messages (``median_step_blocks``,
    ``step_messages``, whose waits it counts), its shape (``hidden``, ``microbatch_size``).
    A row stored before the lab kept them does not.

    >>> replayable({"block_times": [{}], "median_step_blocks": [{}], "step_messages": [],
    ...             "hidden": 512, "microbatch_size": 32})
    True
    >>> replayable({"block_times": [{}], "median_step_blocks": [{}], "hidden": 512,
    ...             "microbatch_size": 32})  # no messages: their waits could not be counted
    False
    """
    return (all(isinstance(row.get(k), list) and row[k]
                for k in ("block_times", "median_step_blocks"))
            and isinstance(row.get("step_messages"), list)
            and given(row.get("hidden")) and given(row.get("microbatch_size")))


def replays(rows: list[dict], profile) -> list:
    """The replay's columns of each pipeline row (a dict per row, as
    :func:`labkit.pipeline.report.add_model` adds them: it reads the schedule's own work off
    all the rows of a launch together), or None for every row where any row is not
    :func:`replayable` or there is no profile: one model for the whole table."""
    import pandas as pd

    from labkit.pipeline.report import add_model

    if profile is None or not rows or not all(replayable(r) for r in rows):
        return [None] * len(rows)
    return add_model(pd.DataFrame(rows), profile).to_dict("records")
