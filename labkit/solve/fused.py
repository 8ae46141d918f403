"""Rank side: CG's vector work in as few passes over memory as the machine allows.

A CG iteration (Chronopoulos-Gear form, :func:`labkit.solve.krylov.cg`) is memory bound: its
time is the bytes it moves. The textbook loop runs one torch operation per update, each its own
pass: ``p = u + beta p``, ``s = w + beta s``, ``r -= alpha s``, ``x += alpha p`` read and write
their vectors separately (12 streams), and the two dot products read theirs again (3). Done
element by element in one loop, as HPCG's and PETSc's fused kernels do, the same updates read
x, p, s, r, w once and write x, p, s, r once: 9 streams, 12 per iteration with the dots instead
of 15. The two dot products, (r, r) and (w, r), read r twice as two torch.dot calls; one compiled
pass reads r and w once (11 streams). A compiled call costs ~45 us more than a torch.dot here, so
the compiled dots are used from :data:`~labkit.solve.formulas.FUSED_DOTS_MIN_ROWS` rows on only,
and on the CPU only: Inductor does not split a reduction whose length is symbolic, so on a GPU
one thread block sums every row (16M rows on an H100: 9.7 ms, against 0.15 ms for two
torch.dot calls and 0.43 ms for the compiled update), and the GPU keeps cuBLAS's two dots.

The SpMV and the two dots go one step further on the CPU: :mod:`labkit.solve.cspmv` sums both
dots inside the SpMV's own pass (9 streams per iteration besides the SpMV: the fewest, see
:data:`~labkit.solve.formulas.MINIMAL_VECTOR_STREAMS`); :func:`make_kernels` loads it beside the
compiled update (``Kernels.spmv_dots``, None with the reason where it cannot run).

Python cannot write that loop fast, so :func:`make_kernels` hands the update to
``torch.compile`` (Inductor writes and compiles the C++ loop, or a Triton kernel on a GPU). It
needs a C++ compiler; where compiling fails the caller gets ``None`` and the reason, and keeps
the plain kernels. The compile runs once per process, before anything is timed, on a small
vector with dynamic shapes (no recompile for the real size); Inductor caches it on disk.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from labkit.solve.formulas import FUSED_DOTS_MIN_ROWS


@dataclass
class Kernels:
    """The compiled update and dots, and what compiling them cost."""

    update: object  # (x, p, s, r, u, w, coef) -> None, in place; coef = [alpha_old, alpha, beta]
    dots_pass: object  # (r, w) -> tensor([(r, r), (w, r)]), one pass; None: two torch.dot
    compile_time_s: float
    device: torch.device
    #: the SpMV with both dots in its pass (labkit.solve.cspmv), None where it cannot run
    spmv_dots: object = None
    spmv_dots_notice: str | None = None

    def dots(self, r, w) -> torch.Tensor:
        """[(r, r), (w, r)]: one compiled pass from FUSED_DOTS_MIN_ROWS rows on, two torch.dot
        calls below (where the compiled call costs more than the stream it saves) and on a GPU."""
        if self.one_pass_dots(len(r)):
            return self.dots_pass(r, w)
        return torch.stack([torch.dot(r, r), torch.dot(w, r)])

    def one_pass_dots(self, rows: int) -> bool:
        """Whether the two dots over ``rows`` rows take one compiled pass (2 streams, not 3)."""
        return self.dots_pass is not None and rows >= FUSED_DOTS_MIN_ROWS

    def step(self, x, p, s, r, u, w, alpha_old: float, alpha: float, beta: float) -> None:
        # the scalars travel as one tensor: compiled code would otherwise be specialised to,
        # and recompiled for, every value of alpha and beta
        coef = torch.tensor([alpha_old, alpha, beta], dtype=x.dtype, device=self.device)
        self.update(x, p, s, r, u, w, coef)


def _update(x, p, s, r, u, w, coef):
    # the order of the textbook loop, element by element: x with the old p and alpha (the
    # update the textbook loop delays behind the all-reduce), then p, s, r
    alpha_old, alpha, beta = coef[0], coef[1], coef[2]
    x.add_(alpha_old * p)
    p.copy_(u + beta * p)
    s.copy_(w + beta * s)
    r.sub_(alpha * s)


def _dots(r, w):
    # both reductions in one loop over r and w (Inductor fuses reductions over one range)
    return torch.stack([torch.sum(r * r), torch.sum(w * r)])


def make_kernels(device: torch.device) -> tuple[Kernels | None, str | None]:
    """Compile the fused update for ``device``; (kernels, None) or (None, reason)."""
    t0 = time.perf_counter()
    try:
        import torch._inductor.config as inductor

        inductor.compile_threads = 1  # one rank, one core: no compile worker pool
        update = torch.compile(_update, dynamic=True, fullgraph=True)
        # a GPU sums a symbolic-length reduction in one thread block: two cuBLAS dots there
        dots = (torch.compile(_dots, dynamic=True, fullgraph=True) if device.type == "cpu"
                else None)
        for n in (4096, 4099):  # two sizes: one dynamic-shape kernel serves every size
            v = [torch.rand(n, dtype=torch.float64, device=device) for _ in range(6)]
            update(*v, torch.tensor([0.5, 0.25, 0.125], dtype=torch.float64, device=device))
            if dots is not None:
                dots(v[0], v[1])
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as e:  # noqa: BLE001 - no compiler, an unsupported platform: plain kernels
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    from labkit.solve.cspmv import load

    spmv_dots, why = load(device, torch.float64, torch.int32)
    return Kernels(update, dots, time.perf_counter() - t0, device, spmv_dots, why), None
