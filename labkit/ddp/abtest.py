"""An A/B of DDP's bucket size inside one launch (pure: validated on the host, no torch).

Two launches run minutes apart on a machine whose state drifts (a neighbour's load, the
clock's turbo): their difference mixes the change with the drift. :class:`ABConfig` makes the
launch of run B also build run A's DDP model (``compare_bucket_cap_mb``) and time one step of
each in turn, round after round (A B A B ..., :func:`labkit.ddp.worker._rounds`), so the
machine's state falls on both alike; :func:`ab_rounds` reports a difference only beyond the
spread of the rounds.
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit.config import option, positive_number
from labkit.ddp.config import DDPConfig
from labkit.ddp.diff import delta_pct
from labkit.errors import UsageError


@dataclass(frozen=True)
class ABConfig(DDPConfig):
    """A :class:`~labkit.ddp.config.DDPConfig` (run B) whose launches of more than one rank
    also time, in the same rounds, the same DDP model with ``compare_bucket_cap_mb`` (run A;
    None: no A/B, the plain config). Its DDP rows of more than one rank carry A's step times
    beside B's (a 1-rank launch all-reduces nothing: no A/B there).

    >>> ABConfig(bucket_cap_mb=1, compare_bucket_cap_mb=25).compare_bucket_cap_mb
    25.0
    >>> ABConfig(compare_bucket_cap_mb=25, breakdown=False)
    Traceback (most recent call last):
    ...
    labkit.errors.UsageError: compare_bucket_cap_mb times A in the breakdown's rounds: keep breakdown=True
    """

    compare_bucket_cap_mb: float | None = option(
        None, "bucket size in MB of run A, timed in the same rounds as this config's (run B)",
        cli=False)

    def __post_init__(self):
        super().__post_init__()
        c = self.compare_bucket_cap_mb
        if c is None:
            return
        if isinstance(c, bool):
            raise UsageError(f"compare_bucket_cap_mb must be a number > 0, got {c!r}")
        object.__setattr__(self, "compare_bucket_cap_mb",
                           positive_number("compare_bucket_cap_mb", c))
        if not self.breakdown:
            raise UsageError("compare_bucket_cap_mb times A in the breakdown's rounds: keep "
                             "breakdown=True")


def ab_rounds(a_times_s, b_times_s) -> dict:
    """B against A, round by round: each round's change of B's throughput against A's,
    ``(t_A / t_B - 1) x 100`` (:func:`labkit.ddp.diff.delta_pct`; positive: B faster), their
    median and their spread (p25 to p75 over the rounds). ``differs``: the whole spread lies
    on one side of 0, so the difference is beyond the rounds' own scatter.

    Four rounds where B is faster in three by about 4% and slower in one:

    >>> r = ab_rounds([0.104, 0.105, 0.100, 0.103], [0.100, 0.100, 0.102, 0.099])
    >>> [round(d, 1) for d in r["deltas_pct"]], round(r["median_pct"], 1), r["differs"]
    ([4.0, 5.0, -2.0, 4.0], 4.0, True)
    >>> ab_rounds([0.100, 0.105, 0.098], [0.104, 0.100, 0.099])["differs"]
    False
    """
    import numpy as np

    pairs = list(zip(a_times_s, b_times_s))
    if len(pairs) < 2 or len(pairs) != len(a_times_s) or len(pairs) != len(b_times_s):
        raise UsageError("an A/B needs the same number of rounds of A and B, at least 2")
    d = np.array([delta_pct(float(a), float(b)) for a, b in pairs])
    p25, med, p75 = (float(x) for x in np.percentile(d, [25, 50, 75]))
    return {"rounds": len(d), "deltas_pct": d.tolist(), "median_pct": med, "p25_pct": p25,
            "p75_pct": p75, "differs": bool(p25 > 0 or p75 < 0)}
