"""The machine profile: what this machine does, measured once per run of the lab.

Every model in the lab predicts a time on *this* machine, so every model needs this machine's
numbers: how fast one rank computes alone and with every rank computing at once (the co-run
slowdown), how fast memory copies go alone and together, what an all-reduce and a point-to-point
message cost over sizes with the peer idle and with its core busy. ``labkit lab`` measures them
first (notebook 01 shows them; ``labkit calibrate`` from a terminal) and stores them with the
run's results; every later notebook reads them with :func:`profile`.

``from labkit import machine`` is cheap (no torch): the profile is pure once measured.
"""

from labkit.machine.profile import ENV, FILE, Profile, profile

__all__ = ["ENV", "FILE", "Profile", "profile"]
