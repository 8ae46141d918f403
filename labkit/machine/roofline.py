"""The roofline of this machine, from its measured profile (pure: no torch).

A kernel that does ``I`` floating-point operations per byte it moves to and from memory (its
arithmetic intensity) runs at most at ``min(peak, bandwidth x I)``: below the **ridge point**
``peak / bandwidth`` memory is the limit, above it the arithmetic units. Both roofs here are
measured, not read off a datasheet: the peak is the best matrix-product rate of one rank in
the machine profile (:meth:`labkit.machine.profile.Profile.matmul_flop_per_s` over its sizes),
the bandwidth its copy rate (bytes read + written per second). The **model FLOPs utilisation**
of a training step is its model FLOPs per second over that peak
(:func:`labkit.ddp.formulas.mfu`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Roofline:
    """Two measured roofs of one rank: ``peak_flop_per_s`` and ``bandwidth_bytes_per_s``.

    12 GFLOP/s of products, 8 GB/s of copies: the ridge at 1.5 FLOP per byte; a kernel of
    0.5 FLOP/byte reaches 4 GFLOP/s, one of 10 FLOP/byte the peak:

    >>> roof = Roofline(peak_flop_per_s=12e9, bandwidth_bytes_per_s=8e9)
    >>> roof.ridge_flop_per_byte, roof.attainable_flop_per_s(0.5), roof.attainable_flop_per_s(10)
    (1.5, 4000000000.0, 12000000000.0)
    """

    peak_flop_per_s: float
    bandwidth_bytes_per_s: float

    def __post_init__(self):
        for name in ("peak_flop_per_s", "bandwidth_bytes_per_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and v > 0 and v != float("inf")):
                raise ValueError(f"{name} must be a finite number > 0, got {v!r}")

    @property
    def ridge_flop_per_byte(self) -> float:
        return ridge_point(peak_flop_per_s=self.peak_flop_per_s,
                           bandwidth_bytes_per_s=self.bandwidth_bytes_per_s)

    def attainable_flop_per_s(self, intensity_flop_per_byte: float) -> float:
        return attainable(intensity_flop_per_byte, peak_flop_per_s=self.peak_flop_per_s,
                          bandwidth_bytes_per_s=self.bandwidth_bytes_per_s)


def peak_rate(rates) -> float:
    """The peak: the best of the measured rates (FLOP/s).

    >>> peak_rate([3.1e9, 11.8e9, 10.2e9])
    11800000000.0
    """
    rates = [float(r) for r in rates if r is not None and r > 0]
    if not rates:
        raise ValueError("no measured rate > 0")
    return max(rates)


def ridge_point(*, peak_flop_per_s: float, bandwidth_bytes_per_s: float) -> float:
    """FLOP per byte from which the arithmetic units, not memory, limit: peak / bandwidth.

    >>> ridge_point(peak_flop_per_s=67e12, bandwidth_bytes_per_s=3.35e12)  # H100's datasheet
    20.0
    """
    return float(peak_flop_per_s) / float(bandwidth_bytes_per_s)


def attainable(intensity_flop_per_byte: float, *, peak_flop_per_s: float,
               bandwidth_bytes_per_s: float) -> float:
    """The roof at an arithmetic intensity: ``min(peak, bandwidth x intensity)``.

    >>> attainable(2.0, peak_flop_per_s=12e9, bandwidth_bytes_per_s=8e9)
    12000000000.0
    >>> attainable(1.0, peak_flop_per_s=12e9, bandwidth_bytes_per_s=8e9)
    8000000000.0
    """
    if intensity_flop_per_byte < 0:
        raise ValueError(f"intensity must be >= 0, got {intensity_flop_per_byte!r}")
    return min(float(peak_flop_per_s), float(bandwidth_bytes_per_s) * intensity_flop_per_byte)


def matmul_intensity(n: float, *, bytes_per_value: int = 4) -> float:
    """FLOP per byte of an n x n @ n x n product that reads both factors and writes the result
    once: ``2 n^3 / (3 n^2 b) = 2 n / (3 b)``; at n = 512 in fp32, 85 FLOP/byte.

    >>> round(matmul_intensity(512), 1)
    85.3
    """
    return 2.0 * float(n) / (3.0 * bytes_per_value)


def from_profile(prof) -> Roofline:
    """The roofline of one rank alone from a machine profile: the best matrix-product rate over
    its sizes and the copy rate (:class:`~labkit.machine.profile.Profile`)."""
    sizes = sorted(r["n"] for r in prof.rows
                   if r.get("measurement") == "matmul" and r.get("context") == "alone")
    return Roofline(peak_flop_per_s=peak_rate(prof.matmul_flop_per_s(n) for n in sizes),
                    bandwidth_bytes_per_s=float(prof.copy_bytes_per_s()))


def catalog_key(device_name: str, keys) -> str | None:
    """The accelerator catalogue's key (``data/accelerators.yaml``) of a device named
    ``device_name`` (as CUDA names it), matched by the key's model number (its first part with
    a digit: ``H100`` of ``H100_SXM``) as a word of the name; None when no key or several
    match (a CPU, a GPU the catalogue lacks).

    >>> keys = ["H100_SXM", "H200", "A100", "V100", "RTX_2080_Ti", "local"]
    >>> catalog_key("NVIDIA H100 80GB HBM3", keys), catalog_key("Tesla V100-SXM2-32GB", keys)
    ('H100_SXM', 'V100')
    >>> catalog_key("AMD EPYC 7763 64-Core Processor", keys) is None
    True
    """
    words = set(re.split(r"[^A-Z0-9]+", str(device_name).upper()))
    found = []
    for key in keys:
        model = next((p for p in str(key).upper().split("_") if any(c.isdigit() for c in p)),
                     None)
        if model is not None and model in words:
            found.append(key)
    return found[0] if len(found) == 1 else None
