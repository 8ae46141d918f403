"""What notebook 04 says of its numbers: the sentences of :mod:`labkit.solve.memory`'s
point, computed from its numbers (pure: no torch), and the notes of its laws.
"""

from __future__ import annotations


def slowdown_source(m: dict) -> str:
    """Which copies gave the model's s, and what the other reading said.

    >>> slowdown_source({"launch_reading": {"copy_slowdown": 1.05}, "profile_slowdown": 1.31})
    "s: this launch's copies of the iteration's bytes; the profile's at a share's footprint read 1.31"
    >>> slowdown_source({"launch_reading": None, "profile_slowdown": 1.31})
    "s: the profile's copies at a share's footprint (the launch timed none)"
    """
    if m.get("launch_reading"):
        return ("s: this launch's copies of the iteration's bytes; the profile's at a share's "
                f"footprint read {m['profile_slowdown']:.2f}")
    return "s: the profile's copies at a share's footprint (the launch timed none)"


def launch_sentence(m: dict) -> str:
    """Where the model's s comes from, computed from :func:`~labkit.solve.memory.point`'s
    numbers: the copies the launch timed beside its solves
    (:func:`~labkit.solve.memory.launch_copy_reading`), with the profile's reading beside them;
    or the profile's, where the launch timed none.

    >>> m = {"ranks": 2, "slowdown": 1.25, "profile_slowdown": 1.31,
    ...      "launch_reading": {"buffer_bytes": 12.5e6, "alone_bytes_per_s": 20e9, "cores": 2,
    ...                         "together_bytes_per_s": 16e9, "copy_slowdown": 1.25}}
    >>> print(launch_sentence(m))  # doctest: +NORMALIZE_WHITESPACE
    The model takes s from the copies this launch timed beside its solves (12.5 MB buffers,
    half each rank's bytes per iteration, which a copy moves; each rank's best copy): 20.0 GB/s
    alone, 16.0 GB/s each with 2 ranks copying at once, s = 1.25; the profile's copies, timed
    before this notebook, read 1.31.
    >>> four = {**m, "ranks": 4, "slowdown": 2.5}
    >>> launch_sentence(four).split("at once")[1][:45]
    ', and 4 ranks take turns on 2 cores, s = 2.50'
    >>> print(launch_sentence({**m, "launch_reading": None}))
    The launch timed no copies of its own: the model takes the profile's s = 1.25.
    """
    r = m.get("launch_reading")
    if not r:
        return f"The launch timed no copies of its own: the model takes the profile's s = " \
               f"{m['slowdown']:.2f}."
    p, cores = m["ranks"], r.get("cores")
    turns = f", and {p} ranks take turns on {cores} cores" if cores and p > cores else ""
    return (f"The model takes s from the copies this launch timed beside its solves "
            f"({r['buffer_bytes'] / 1e6:.3g} MB buffers, half each rank's bytes per iteration, "
            f"which a copy moves; each rank's best copy): {r['alone_bytes_per_s'] / 1e9:.1f} "
            f"GB/s alone, {r['together_bytes_per_s'] / 1e9:.1f} GB/s each with {p} ranks "
            f"copying at once{turns}, s = {m['slowdown']:.2f}; the profile's copies, timed "
            f"before this notebook, read {m['profile_slowdown']:.2f}.")


def parts_note(m: dict) -> str:
    """Each part of one rank's iteration alone against its own bytes' floor at the same copy
    rate (``parts1`` of :func:`point`: (time, floor) per part), and which part runs furthest
    below the copy's rate; "" where the row does not time them apart.

    >>> print(parts_note({"parts1": {"SpMV": (1.0e-3, 0.4e-3),
    ...                              "vector updates": (0.3e-3, 0.36e-3)}}))
    ... # doctest: +NORMALIZE_WHITESPACE
    SpMV 1.00 ms against its bytes' floor 0.40 ms (0.40 of the copy's rate), vector updates
    0.30 ms against 0.36 ms (1.20): furthest below the copy's rate: the SpMV
    >>> parts_note({"parts1": {"SpMV": (0.4e-3, 0.4e-3), "vector updates": (0.3e-3, 0.36e-3)}}
    ...            ).split(": ")[-1]
    'each part at least as fast as a copy of its bytes'
    >>> parts_note({"parts1": None})
    ''
    """
    parts = m.get("parts1")
    if not parts:
        return ""
    frac = {k: floor / t for k, (t, floor) in parts.items() if t > 0}
    (a, (ta, fa)), (b, (tb, fb)) = list(parts.items())[:2]
    slowest = min(frac, key=frac.get)
    which = (f"furthest below the copy's rate: the {slowest}" if frac[slowest] < 1 else
             "each part at least as fast as a copy of its bytes")
    return (f"{a} {ta * 1e3:.2f} ms against its bytes' floor {fa * 1e3:.2f} ms ({frac[a]:.2f} "
            f"of the copy's rate), {b} {tb * 1e3:.2f} ms against {fb * 1e3:.2f} ms "
            f"({frac[b]:.2f}): {which}")


def floor_sentence(m: dict) -> str:
    """How close one rank runs to the copy bandwidth, computed from :func:`point`'s numbers.

    >>> print(floor_sentence({"fraction1": 0.8, "t1_s": 3e-3, "floor1_s": 2.4e-3,
    ...                       "minimal_floor1_s": 1.8e-3}))  # doctest: +NORMALIZE_WHITESPACE
    1 rank alone runs its iteration at 0.80 of the copy bandwidth (3.00 ms against a floor of
    2.40 ms): slower than copying its bytes. The fewest bytes a correct iteration moves would
    allow 1.80 ms, 1.67x faster than measured.
    >>> floor_sentence({"fraction1": 1.1, "t1_s": 2e-3, "floor1_s": 2.2e-3,
    ...                 "minimal_floor1_s": None}).split("): ")[1]
    "faster than one copy of its bytes (the machine profile's copy holding as much data ran slower: the machine's state changed between them, or the caches served more of the iteration's re-reads than of the copy's single pass)."
    """
    f = m["fraction1"]
    if round(f, 2) == 1.0:
        how = "as fast as one copy of its bytes."
    elif f < 1:
        how = "slower than copying its bytes."
    else:
        how = ("faster than one copy of its bytes (the machine profile's copy holding as much "
               "data ran slower: the machine's state changed between them, or the caches served "
               "more of the iteration's re-reads than of the copy's single pass).")
    text = (f"1 rank alone runs its iteration at {f:.2f} of the copy bandwidth "
            f"({m['t1_s'] * 1e3:.2f} ms against a floor of {m['floor1_s'] * 1e3:.2f} ms): {how}")
    least = m.get("minimal_floor1_s")
    if least and m["t1_s"] / least >= 1.005:
        text += (f" The fewest bytes a correct iteration moves would allow {least * 1e3:.2f} ms, "
                 f"{m['t1_s'] / least:.2f}x faster than measured.")
    elif least:
        text += (f" The fewest bytes a correct iteration moves would allow {least * 1e3:.2f} ms:"
                 " no faster than measured (these kernels move no more than that).")
    parts = parts_note(m)
    return text + (f" Its parts timed apart: {parts}." if parts else "")


def co_run_sentence(m: dict) -> str:
    """What sharing the memory system did to the P ranks, computed from :func:`point`'s numbers
    (a share against itself where it was timed alone, ``share_fraction`` given; else the shares
    in the solve against the whole problem alone over P).

    >>> print(co_run_sentence({"ranks": 2, "measured_slowdown": 1.3, "slowdown": 1.25,
    ...                        "speedup": 1.46, "share_fraction": 0.9}))  # doctest: +NORMALIZE_WHITESPACE
    Beside each other, 2 ranks computed their shares 1.30x slower than each share alone (the
    model's s: 1.25x), so the speedup of 2 ranks is 1.46, not 2.
    >>> co_run_sentence({"ranks": 2, "measured_slowdown": 0.98, "slowdown": 1.25,
    ...                  "speedup": 2.1, "share_fraction": 0.9}).split(" (the")[0]
    'Beside each other, 2 ranks computed their shares no slower than each share alone (0.98x)'
    >>> co_run_sentence({"ranks": 2, "measured_slowdown": 0.9, "slowdown": 1.25,
    ...                  "speedup": 2.1}).split(", so")[0]
    "Beside each other, 2 ranks computed their shares 0.90x the time alone: faster (each rank's share fits a cache the whole problem did not) (the model's s: 1.25x)"
    """
    s, p = m["measured_slowdown"], m["ranks"]
    f = m.get("share_fraction")
    if f is not None and f == f:  # each share against itself
        how = (f"{s:.2f}x slower than each share alone" if s >= 1 else
               f"no slower than each share alone ({s:.2f}x)")
    else:
        how = (f"{s:.2f}x slower than alone" if s >= 1 else
               f"{s:.2f}x the time alone: faster (each rank's share fits a cache the whole "
               "problem did not)")
    return (f"Beside each other, {p} ranks computed their shares {how} (the model's s: "
            f"{m['slowdown']:.2f}x), so the speedup of {p} ranks is {m['speedup']:.2f}, not {p}.")


def share_sentence(m: dict) -> str:
    """A rank's share alone against its part of the whole problem alone (compute_1 / P),
    computed from :func:`point`'s numbers.

    >>> m = {"ranks": 2, "share_alone_s": 1.2e-3, "compute1_s": 3e-3, "share_fraction": 0.8,
    ...      "reading": {"footprint_per_rank": 13e6}}
    >>> print(share_sentence(m))  # doctest: +NORMALIZE_WHITESPACE
    A rank's share alone computed 1200 us per iteration, 0.80 of compute_1 / 2 (1500 us): faster
    per byte than the whole problem, whose data take 2 times the 13 MB of a share.
    >>> share_sentence({**m, "share_fraction": 1.1}).split(": ")[1]
    'slower than its part of the whole problem (each share also reads its halo and computes its boundary rows apart).'
    >>> share_sentence({**m, "share_fraction": float("nan")})[:34]
    'No share was timed alone here: the'
    """
    p, f, whole = m["ranks"], m.get("share_fraction"), m["compute1_s"] / m["ranks"]
    if f is None or f != f:
        return (f"No share was timed alone here: the model takes compute_1 / {p} = "
                f"{whole * 1e6:.0f} us for a share.")
    if round(f, 2) == 1.0:
        how = "as fast as its part of the whole problem."
    elif f < 1:
        how = (f"faster per byte than the whole problem, whose data take {p} times the "
               f"{m['reading']['footprint_per_rank'] / 1e6:.3g} MB of a share.")
    else:
        how = ("slower than its part of the whole problem (each share also reads its halo and "
               "computes its boundary rows apart).")
    return (f"A rank's share alone computed {m['share_alone_s'] * 1e6:.0f} us per iteration, "
            f"{f:.2f} of compute_1 / {p} ({whole * 1e6:.0f} us): {how}")


def reading_sentence(r: dict, *, cores: int | None = None, used: bool = True) -> str:
    """Which size of the machine profile's copies the model read, and why its s is what it is,
    computed from :func:`co_run_reading`'s numbers (``cores``: say so when the ranks outnumber
    them).

    >>> r = {"ranks": 2, "footprint_per_rank": 13e6, "copy_size_bytes": 6.5e6,
    ...      "alone_bytes_per_s": 23e9, "together_bytes_per_s": 17e9, "copy_slowdown": 23 / 17,
    ...      "slowdown": 23 / 17}
    >>> print(reading_sentence(r))  # doctest: +NORMALIZE_WHITESPACE
    The model reads the machine profile's copies at 6.2 MiB per rank, the copy whose data take
    the 13 MB each rank's iteration holds (its matrix and vectors): alone it ran at 23.0 GB/s,
    with 2 ranks copying at once at 17.0 GB/s each: copies of this size slow each other 1.35x
    (they share the memory's bandwidth), s = 1.35.
    >>> print(reading_sentence({**r, "footprint_per_rank": 1e6, "copy_size_bytes": 5e5,
    ...                         "together_bytes_per_s": 22.5e9, "copy_slowdown": 1.02,
    ...                         "slowdown": 1.02}).split(": ", 2)[2])
    copies of this size barely slow each other (1.02x: the caches hold every rank's), s = 1.02.
    >>> reading_sentence({**r, "ranks": 4, "slowdown": 2.7}, cores=2).split("), ")[-1]
    'and 4 ranks take turns on 2 cores, s = 2.70.'
    >>> reading_sentence(r, used=False)[:40]  # where the model takes s from elsewhere
    "The machine profile's copies, read at 6."

    With a share timed alone (:func:`~labkit.solve.formulas.co_run_slowdown`):

    >>> shared = {**r, "share_floor_s": 0.9e-3, "share_alone_s": 1.5e-3,
    ...           "bandwidth_fraction": 0.6}
    >>> print(reading_sentence(shared).split("bandwidth), ")[1])  # doctest: +NORMALIZE_WHITESPACE
    and a share alone computed 1500 us per iteration against its floor of 900 us at that
    copy's rate alone (0.60 of it): below the copy's rate, its accesses still wait on the same
    memory, so the whole share slows as the copies do, s = 1.35.
    """
    p, copy = r["ranks"], r["copy_slowdown"]
    # within 10 % of alone: no memory traffic between the ranks' copies worth the name
    where = (f"barely slow each other ({copy:.2f}x: the caches hold every rank's)" if copy <= 1.1
             else f"slow each other {copy:.2f}x (they share the memory's bandwidth)")
    turns = (f", and {p} ranks take turns on {cores} cores" if cores is not None and p > cores
             else "")
    eq = ", s = " if used else ", its s = "
    if r.get("share_floor_s") is not None:  # how far below the copy's rate the share ran
        below = ("below the copy's rate, its accesses still wait on the same memory, so the "
                 "whole share slows as the copies do" if r["bandwidth_fraction"] < 1
                 else "at the copy's rate, it slows as the copies do")
        turns = (f", and a share alone computed {r['share_alone_s'] * 1e6:.0f} us per iteration "
                 f"against its floor of {r['share_floor_s'] * 1e6:.0f} us at that copy's rate "
                 f"alone ({r['bandwidth_fraction']:.2f} of it): {below}{turns}")
    head = "The model reads the machine profile's copies at" if used else \
        "The machine profile's copies, read at"
    return (f"{head} "
            f"{r['copy_size_bytes'] / 2 ** 20:.2g} MiB per rank, the copy whose data take the "
            f"{r['footprint_per_rank'] / 1e6:.3g} MB each rank's iteration holds (its matrix and "
            f"vectors): alone it ran at {r['alone_bytes_per_s'] / 1e9:.1f} GB/s, with {p} ranks "
            f"copying at once at {r['together_bytes_per_s'] / 1e9:.1f} GB/s each: copies of this "
            f"size {where}{turns}{eq}{r['slowdown']:.2f}.")
