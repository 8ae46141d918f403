"""A machine profile whose copies are given size by size (tests of the profile's copy reading
and of the solve lab's models that read it): every other measurement fixed, just enough for
:class:`labkit.machine.profile.Profile` to load it and describe itself.
"""

from __future__ import annotations

from labkit.machine.profile import Profile

MiB = 1 << 20


def copy_profile(copies: dict, *, cores: int = 2, world_size: int = 2) -> Profile:
    """``copies``: size in bytes per rank -> (alone, together) copy rate in bytes per second
    (read + write counted, as the profile stores it)."""
    base = {"hostname": "test", "cores": cores, "torch_version": None,
            "world_size": world_size, "timestamp": "2026-11-25T03:00:00+00:00", "n": None,
            "size_bytes": None}
    rows = [{**base, "measurement": m, "context": c, "n": 64, "time_p50_s": 1e-4,
             "flop_per_s": 5e9} for m in ("matmul", "step") for c in ("alone", "together")]
    for size, rates in copies.items():
        for context, rate in zip(("alone", "together"), rates):
            rows.append({**base, "measurement": "copy", "context": context, "size_bytes": size,
                         "time_p50_s": 2 * size / rate, "bytes_per_s": rate})
    for m in ("allreduce", "message"):
        for context in ("idle", "busy"):
            for s in (8, 4096):
                rows.append({**base, "measurement": m, "context": context, "size_bytes": s,
                             "time_p50_s": 1e-4 + s / 1e9,
                             "bytes_per_s": s / (1e-4 + s / 1e9)})
    return Profile.from_rows(rows)


#: this machine's shape, in round numbers: copies that fit the shared cache side by side (1 and
#: 4 MiB a rank) barely slow each other; from 16 MiB a rank they share the memory's bandwidth
CACHE_AND_MEMORY = {1 * MiB: (100e9, 98e9), 4 * MiB: (100e9, 95e9), 16 * MiB: (60e9, 34e9),
                    32 * MiB: (45e9, 25e9)}
