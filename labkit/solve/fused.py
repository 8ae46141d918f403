"""Rank side: CG's vector work in as few passes over memory as the machine allows.

A CG iteration (Chronopoulos-Gear form, :func:`labkit.solve.krylov.cg`) is memory bound: its
time is the bytes it moves. The textbook loop runs one torch operation per update, each its own
pass: ``p = u + beta p``, ``s = w + beta s``, ``r -= alpha s``, ``x += alpha p`` read and write
their vectors separately (12 streams), and the two dot products read theirs again (3). Done
element by element in one loop, as HPCG's and PETSc's fused kernels do, the same updates read
x, p, s, r, w once and write x, p, s, r once: 9 streams, 12 per iteration with the dots instead
of 15. The two dot products, (r, r) and (w, r), read r twice as two torch.dot calls; one pass
reads r and w once (11 streams); and summed inside the SpMV's own pass they read nothing (9
streams besides the SpMV: the fewest, see
:data:`~labkit.solve.formulas.MINIMAL_VECTOR_STREAMS`).

Python cannot write these loops fast, so :func:`make_kernels` gets them compiled:

* on the CPU, the C loops of :mod:`labkit.solve.cspmv` (the update, the dots' own pass, and the
  SpMV with the dots in it), compiled with the system's C compiler in a fraction of a second;
* on a GPU, ``torch.compile`` (Inductor writes a Triton kernel) for the update. The dots stay
  two cuBLAS calls: Inductor does not split a reduction whose length is symbolic, so one thread
  block sums every row (16M rows on an H100: 9.7 ms, against 0.15 ms for two torch.dot calls
  and 0.43 ms for the compiled update). The compile runs once per process, before anything is
  timed, on a small vector with dynamic shapes (no recompile for the real size).

Where compiling fails (no compiler) the caller gets ``None`` and the reason, and keeps the plain
kernels.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch


@dataclass
class Kernels:
    """The compiled update and dots, and what compiling them cost."""

    #: (x, p, s, r, u, w, alpha_old, alpha, beta) -> None, in place: x += alpha_old p,
    #: p = u + beta p, s = w + beta s, r -= alpha s (CPasses.update, or _update compiled)
    update: object
    dots_pass: object  # (r, w) -> tensor([(r, r), (w, r)]), one pass; None: two torch.dot
    compile_time_s: float
    device: torch.device
    #: the SpMV with both dots in its pass (labkit.solve.cspmv), None where it cannot run
    spmv_dots: object = None
    spmv_dots_notice: str | None = None
    #: the one dtype the update and dots read (the C loops: float64); None: any
    dtype: torch.dtype | None = None

    def fits(self, dtype: torch.dtype) -> bool:
        """Whether the update and dots can run on vectors of ``dtype``."""
        return self.dtype is None or dtype == self.dtype

    def dots(self, r, w) -> torch.Tensor:
        """[(r, r), (w, r)]: one pass where there is one, else two torch.dot calls."""
        if self.one_pass_dots():
            return self.dots_pass(r, w)
        return torch.stack([torch.dot(r, r), torch.dot(w, r)])

    def one_pass_dots(self) -> bool:
        """Whether the two dots take one pass (2 streams, not 3)."""
        return self.dots_pass is not None

    def step(self, x, p, s, r, u, w, alpha_old: float, alpha: float, beta: float) -> None:
        self.update(x, p, s, r, u, w, alpha_old, alpha, beta)


def _update(x, p, s, r, u, w, coef):
    # the order of the textbook loop, element by element: x with the old p and alpha (the
    # update the textbook loop delays behind the all-reduce), then p, s, r
    alpha_old, alpha, beta = coef[0], coef[1], coef[2]
    x.add_(alpha_old * p)
    p.copy_(u + beta * p)
    s.copy_(w + beta * s)
    r.sub_(alpha * s)


def _compiled_update(device: torch.device):
    """:func:`_update` through ``torch.compile``, called with the scalars as floats."""
    import torch._inductor.config as inductor

    inductor.compile_threads = 1  # one rank, one core: no compile worker pool
    update = torch.compile(_update, dynamic=True, fullgraph=True)

    def step(x, p, s, r, u, w, alpha_old, alpha, beta):
        # the scalars travel as one tensor: compiled code would otherwise be specialised to,
        # and recompiled for, every value of alpha and beta
        update(x, p, s, r, u, w, torch.tensor([alpha_old, alpha, beta], dtype=x.dtype,
                                              device=x.device))

    for n in (4096, 4099):  # two sizes: one dynamic-shape kernel serves every size
        step(*[torch.rand(n, dtype=torch.float64, device=device) for _ in range(6)],
             0.5, 0.25, 0.125)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return step


def make_kernels(device: torch.device) -> tuple[Kernels | None, str | None]:
    """The fused update and dots for ``device``; (kernels, None) or (None, reason)."""
    from labkit.solve.cspmv import load

    t0 = time.perf_counter()
    if device.type == "cpu":
        passes, why = load(device, torch.float64, torch.int32)
        if passes is None:
            return None, why
        return Kernels(passes.update, passes.dots, time.perf_counter() - t0, device,
                       spmv_dots=passes, dtype=torch.float64), None
    try:
        update = _compiled_update(device)
    except Exception as e:  # noqa: BLE001 - no compiler, an unsupported platform: plain kernels
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    _, why = load(device, torch.float64, torch.int32)
    return Kernels(update, None, time.perf_counter() - t0, device, None, why), None
