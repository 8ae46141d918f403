"""Rank side: Krylov methods on a :class:`~labkit.solve.operator.DistOperator`.

Each takes the operator, this rank's part of ``b`` and a tolerance, starts from ``x0 = 0`` and
stops when its residual estimate satisfies ``||r|| <= rtol * ||b||``; each returns a
:class:`Solution` with the iteration count (the number of times ``x`` was updated, as scipy
counts). Every rank runs the same scalar recurrences on the same all-reduced numbers, so all
ranks stop at the same iteration.

Read :func:`cg_textbook` first: Hestenes-Stiefel CG written as in the textbook. It is correct
and distributed, but it allocates new vectors every iteration and pays two all-reduces per
iteration (one for p.Ap, one for r.r). :func:`cg` is the version the lab measures: the
Chronopoulos-Gear rearrangement, which computes both dot products of an iteration after the
same SpMV, so ONE all-reduce carries them, and all vectors are updated in place.

Per iteration (SpMV, all-reduces, vector streams of ``n_owned`` doubles, see
:data:`labkit.solve.formulas.VECTOR_STREAMS`):

==========  =====  ===========  ==========================================================
method      SpMV   all-reduces  note
==========  =====  ===========  ==========================================================
cg          1      1            Chronopoulos-Gear (fused r.r and w.r)
pipecg      1      1            Ghysels-Vanroose: the all-reduce overlaps the SpMV
pcg         1      1            same, Jacobi preconditioner M = diag(A)
bicgstab    2      3            van der Vorst; nonsymmetric-capable
gmres       1      2            GMRES(m), classical Gram-Schmidt twice (CGS2), restarted
minres      1      2            Paige-Saunders (Lanczos + Givens)
==========  =====  ===========  ==========================================================
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from labkit.solve.operator import DistOperator
from labkit.solve.timeline import marker


@dataclass
class Solution:
    x: torch.Tensor  # this rank's owned part
    iterations: int
    converged: bool
    residual_estimate: float  # the method's own ||r|| / ||b||, not the gate's fresh one


def cg_textbook(op: DistOperator, b: torch.Tensor, rtol: float, maxiter: int) -> Solution:
    """NAIVE textbook CG, kept for teaching: new tensors every iteration, 2 all-reduces each."""
    bnorm = math.sqrt(op.dots([(b, b)])[0])
    x = torch.zeros_like(b)
    r = b.clone()
    p = r.clone()
    rr = op.dots([(r, r)])[0]
    k = 0
    while k < maxiter and math.sqrt(rr) > rtol * bnorm:
        p_ext = torch.cat([p, torch.zeros(op.n_halo, dtype=p.dtype, device=p.device)])
        ap = op.matvec(p_ext, torch.empty_like(b))
        alpha = rr / op.dots([(p, ap)])[0]  # all-reduce 1
        x = x + alpha * p
        r = r - alpha * ap
        rr_new = op.dots([(r, r)])[0]  # all-reduce 2
        p = r + (rr_new / rr) * p
        rr = rr_new
        k += 1
    return Solution(x, k, math.sqrt(rr) <= rtol * bnorm, math.sqrt(rr) / bnorm if bnorm else 0.0)


def _cg_steps(k: int, gamma: float, gamma_old: float, delta: float, alpha_old: float):
    """Chronopoulos-Gear step lengths from this iteration's dot products (shared by :func:`cg`
    and :func:`pipecg`): beta = gamma / gamma_old, alpha = gamma / (delta - beta gamma / alpha_old);
    the first iteration is plain steepest descent (beta = 0, alpha = gamma / delta)."""
    if k == 0:
        return gamma / delta, 0.0
    beta = gamma / gamma_old
    return gamma / (delta - beta * gamma / alpha_old), beta


def fused_kernels(op: DistOperator, jacobi: bool = False):
    """The fused kernels :func:`cg` runs with on ``op``: ``op.fused`` without a preconditioner
    and where its loops read the vectors' dtype; None (the plain loop) otherwise."""
    fused = None if jacobi else getattr(op, "fused", None)
    return fused if fused is not None and fused.fits(op.dtype) else None


def dots_in_spmv(op: DistOperator, fused) -> bool:
    """Whether :func:`cg` with ``fused`` (from :func:`fused_kernels`) sums its two dots in the
    SpMV's pass: the pass loaded, and it can read the operator's arrays."""
    return getattr(fused, "spmv_dots", None) is not None and op.c_pass_unfit is None


def cg(op: DistOperator, b: torch.Tensor, rtol: float, maxiter: int,
       jacobi: bool = False) -> Solution:
    """Conjugate gradients, Chronopoulos-Gear form: one fused all-reduce per iteration.

    With ``u = M^-1 r`` (``u = r`` without preconditioner), ``w = A u``::

        gamma = (r, u), delta = (w, u)        <- one all-reduce, with (r, r) for the test
        beta = gamma / gamma_old;  alpha = gamma / (delta - beta * gamma / alpha_old)
        p = u + beta p;  s = w + beta s       (s = A p, kept by recurrence)
        x += alpha p;    r -= alpha s

    The ``x`` update is applied one iteration late, while the next all-reduce is in flight
    (the same arithmetic in the same order: the result is bit-identical).

    With ``op.fused`` (:mod:`labkit.solve.fused`, unpreconditioned CG only, vectors of a
    dtype its loops read) the four updates are one pass over memory (x with the previous
    iteration's p and alpha first, as above), and the two dots ride on the SpMV's pass
    (:mod:`labkit.solve.cspmv`; where it cannot run, one pass of their own on the CPU, two
    torch.dot calls on a GPU): 9 vector streams per iteration (11 or 12 without the SpMV's
    pass) instead of 15. torch's own ops contract a multiply and an add into one rounding
    (FMA) where the C loops do not, and the sums run in another order: the iterations are the
    same, the solution equal to ~1e-12 relative, not bit for bit.
    """
    fused = fused_kernels(op, jacobi)  # None e.g. for float32 vectors: the C loops read float64
    sw = op.sw
    n = op.n_owned
    bnorm = math.sqrt(op.dots([(b, b)])[0])
    x = op.new()
    # the vector that goes through the SpMV lives in an extended buffer (halo tail): r itself
    # without a preconditioner (no copy), u = M^-1 r with one
    r_ext = op.new_ext()
    r = r_ext[:n]
    r.copy_(b)
    if jacobi:
        u_ext = op.new_ext()
        u = u_ext[:n]
        dinv = 1.0 / op.diag
    else:
        u_ext, u = r_ext, r
    w, p, s = op.new(), op.new(), op.new()
    tol = rtol * bnorm
    k, alpha, gamma_old = 0, 0.0, 0.0
    mark = marker(sw)  # each pass's start, where the solve is traced (labkit.solve.timeline)
    while True:
        mark()
        if jacobi:
            with sw("vector"):
                torch.mul(r, dinv, out=u)
        if dots_in_spmv(op, fused):  # the dots ride on the SpMV
            red = op.matvec_dots(u_ext, w, fused.spmv_dots)
        elif fused is not None:
            op.matvec(u_ext, w)
            with sw("vector"):
                red = fused.dots(r, w)
        else:
            op.matvec(u_ext, w)
            red = op.local_dots([(r, u), (w, u), (r, r)] if jacobi else [(r, r), (w, r)])
        pending = op.allreduce_start(red)
        if k > 0 and fused is None:
            # last iteration's x += alpha p, done while the all-reduce is in flight: nothing
            # else reads x, and p and alpha change only after the wait. The wait then hides
            # the other rank's lateness behind useful work instead of idling.
            with sw("vector"):
                x.add_(p, alpha=alpha)
        op.wait(pending, "allreduce")
        vals = red.tolist()
        gamma, delta = vals[0], vals[1]
        rr = vals[2] if jacobi else gamma
        if math.sqrt(max(rr, 0.0)) <= tol or k >= maxiter or delta == 0.0:
            break
        alpha_old = alpha
        alpha, beta = _cg_steps(k, gamma, gamma_old, delta, alpha)
        with sw("vector"):
            if fused is not None:  # one pass: x (delayed), p, s, r
                fused.step(x, p, s, r, u, w, alpha_old if k > 0 else 0.0, alpha, beta)
            else:
                torch.add(u, p, alpha=beta, out=p)
                torch.add(w, s, alpha=beta, out=s)
                r.add_(s, alpha=-alpha)
        gamma_old = gamma
        k += 1
    if fused is not None and k > 0:  # the delayed update of the last iteration
        x.add_(p, alpha=alpha)
    rnorm = math.sqrt(max(rr, 0.0))
    return Solution(x, k, rnorm <= tol, rnorm / bnorm if bnorm else 0.0)


def pcg(op, b, rtol, maxiter):
    """CG with the Jacobi preconditioner M = diag(A) (same single fused all-reduce)."""
    return cg(op, b, rtol, maxiter, jacobi=True)


def pipecg(op: DistOperator, b: torch.Tensor, rtol: float, maxiter: int) -> Solution:
    """Pipelined CG (Ghysels and Vanroose 2014, unpreconditioned): the iteration's one fused
    all-reduce is started (``async_op=True``) BEFORE the SpMV and waited for after it, so its
    latency hides behind the SpMV; ``allreduce`` holds only the exposed wait.

    The price: three more vector recurrences than :func:`cg` (``z = A s``, ``w = A r`` are kept
    by recurrence too) and a little less accuracy (the recurrences drift further from the true
    residual; the gate checks it). With ``w = A r``::

        start gamma = (r, r), delta = (w, r);   n = A w;   wait
        beta = gamma / gamma_old;  alpha = gamma / (delta - beta * gamma / alpha_old)
        z = n + beta z;  s = w + beta s;  p = r + beta p
        x += alpha p;    r -= alpha s;    w -= alpha z
    """
    sw = op.sw
    n = op.n_owned
    bnorm = math.sqrt(op.dots([(b, b)])[0])
    tol = rtol * bnorm
    x = op.new()
    r_ext, w_ext = op.new_ext(), op.new_ext()
    r, w = r_ext[:n], w_ext[:n]
    r.copy_(b)
    op.matvec(r_ext, w)
    nv, z, s, p = op.new(), op.new(), op.new(), op.new()
    k, alpha, gamma_old = 0, 0.0, 0.0
    mark = marker(sw)
    while True:
        mark()
        red = op.local_dots([(r, r), (w, r)])
        pending = op.allreduce_start(red)
        op.matvec(w_ext, nv)
        op.wait(pending, "allreduce")
        gamma, delta = red.tolist()
        if math.sqrt(max(gamma, 0.0)) <= tol or k >= maxiter or delta == 0.0:
            break
        alpha, beta = _cg_steps(k, gamma, gamma_old, delta, alpha)
        with sw("vector"):
            torch.add(nv, z, alpha=beta, out=z)
            torch.add(w, s, alpha=beta, out=s)
            torch.add(r, p, alpha=beta, out=p)
            x.add_(p, alpha=alpha)
            r.add_(s, alpha=-alpha)
            w.add_(z, alpha=-alpha)
        gamma_old = gamma
        k += 1
    rnorm = math.sqrt(max(gamma, 0.0))
    return Solution(x, k, rnorm <= tol, rnorm / bnorm if bnorm else 0.0)


def bicgstab(op: DistOperator, b: torch.Tensor, rtol: float, maxiter: int) -> Solution:
    """BiCGSTAB (van der Vorst), 2 SpMVs and 3 all-reduces per iteration (two of them fused)."""
    sw = op.sw
    n = op.n_owned
    bnorm = math.sqrt(op.dots([(b, b)])[0])
    tol = rtol * bnorm
    x = op.new()
    r = b.clone()
    r_hat = b.clone()
    p_ext, s_ext = op.new_ext(), op.new_ext()
    p, s = p_ext[:n], s_ext[:n]
    v, t = op.new(), op.new()
    rho, rr = op.dots([(r_hat, r), (r, r)])
    alpha = omega = 1.0
    rho_old = 1.0
    k = 0
    mark = marker(sw)
    while math.sqrt(max(rr, 0.0)) > tol and k < maxiter and rho != 0.0:
        mark()
        beta = (rho / rho_old) * (alpha / omega)
        with sw("vector"):
            p.add_(v, alpha=-omega)
            torch.add(r, p, alpha=beta, out=p)
        op.matvec(p_ext, v)
        rv = op.dots([(r_hat, v)])[0]
        if rv == 0.0:
            break
        alpha = rho / rv
        with sw("vector"):
            torch.add(r, v, alpha=-alpha, out=s)
        op.matvec(s_ext, t)
        ts, tt, ss = op.dots([(t, s), (t, t), (s, s)])
        k += 1
        if math.sqrt(max(ss, 0.0)) <= tol or tt == 0.0:
            with sw("vector"):
                x.add_(p, alpha=alpha)
            rr = ss
            break
        omega = ts / tt
        with sw("vector"):
            x.add_(p, alpha=alpha)
            x.add_(s, alpha=omega)
            torch.add(s, t, alpha=-omega, out=r)
        rho_old = rho
        rho, rr = op.dots([(r_hat, r), (r, r)])
        if omega == 0.0:
            break
    rnorm = math.sqrt(max(rr, 0.0))
    return Solution(x, k, rnorm <= tol, rnorm / bnorm if bnorm else 0.0)


def gmres(op: DistOperator, b: torch.Tensor, rtol: float, maxiter: int,
          restart: int = 30) -> Solution:
    """Restarted GMRES(m), classical Gram-Schmidt applied twice (CGS2).

    CGS needs the whole column of projections h = V^T w at once, so one all-reduce carries all
    of them (modified Gram-Schmidt would need j+1 all-reduces in step j); the second pass fixes
    the orthogonality CGS loses, and carries (w, w) in the same all-reduce, from which
    ||w_new||^2 = (w, w) - ||h2||^2 (Pythagoras, V orthonormal).
    """
    sw = op.sw
    n = op.n_owned
    m = int(restart)
    bnorm = math.sqrt(op.dots([(b, b)])[0])
    tol = rtol * bnorm
    x = op.new()
    x_ext = op.new_ext()
    V = torch.zeros((m + 1, op.n_ext), dtype=b.dtype, device=b.device)  # rows: basis vectors
    Vo = V[:, :n]  # owned parts (a strided view: row stride n_ext)
    w = op.new()
    k = 0
    rnorm = bnorm
    mark = marker(sw)  # at each inner step: a restart's work falls in the step before it
    while k < maxiter:
        if k == 0:
            r = b
        else:
            x_ext[:n] = x
            r = b - op.matvec(x_ext, op.new())
        beta = math.sqrt(op.dots([(r, r)])[0])
        rnorm = beta
        if beta <= tol:
            break
        with sw("vector"):
            torch.div(r, beta, out=Vo[0])
        H = np.zeros((m + 1, m))
        cs, sn = np.zeros(m), np.zeros(m)
        g = np.zeros(m + 1)
        g[0] = beta
        j = 0
        while j < m and k < maxiter:
            mark()
            op.matvec(V[j], w)
            Vj = Vo[: j + 1]
            with sw("vector"):
                h = torch.mv(Vj, w)
            h = op.allreduce(h)
            with sw("vector"):
                w.sub_(torch.mv(Vj.T, h))
                h2 = torch.cat([torch.mv(Vj, w), torch.dot(w, w).reshape(1)])
            h2 = op.allreduce(h2)
            with sw("vector"):
                w.sub_(torch.mv(Vj.T, h2[:-1]))
            hv = (h + h2[:-1]).tolist()
            h2v = h2.tolist()
            hnorm = math.sqrt(max(h2v[-1] - sum(v * v for v in h2v[:-1]), 0.0))
            H[: j + 1, j] = hv
            H[j + 1, j] = hnorm
            if hnorm > 0:
                with sw("vector"):
                    torch.div(w, hnorm, out=Vo[j + 1])
            for i in range(j):  # apply the earlier Givens rotations to the new column
                H[i, j], H[i + 1, j] = (cs[i] * H[i, j] + sn[i] * H[i + 1, j],
                                        -sn[i] * H[i, j] + cs[i] * H[i + 1, j])
            denom = math.hypot(H[j, j], H[j + 1, j])
            cs[j], sn[j] = (H[j, j] / denom, H[j + 1, j] / denom) if denom else (1.0, 0.0)
            H[j, j] = denom
            H[j + 1, j] = 0.0
            g[j + 1] = -sn[j] * g[j]
            g[j] = cs[j] * g[j]
            rnorm = abs(g[j + 1])
            j += 1
            k += 1
            if rnorm <= tol or hnorm == 0.0:
                break
        y = _back_substitute(H[:j, :j], g[:j])
        with sw("vector"):
            x.add_(torch.mv(Vo[:j].T, torch.as_tensor(y, dtype=b.dtype, device=b.device)))
        if rnorm <= tol:
            break
    return Solution(x, k, rnorm <= tol, rnorm / bnorm if bnorm else 0.0)


def _back_substitute(R: np.ndarray, g: np.ndarray) -> np.ndarray:
    y = np.zeros(len(g))
    for i in range(len(g) - 1, -1, -1):
        y[i] = (g[i] - R[i, i + 1:] @ y[i + 1:]) / R[i, i] if R[i, i] else 0.0
    return y


def minres(op: DistOperator, b: torch.Tensor, rtol: float, maxiter: int) -> Solution:
    """MINRES (Paige-Saunders, as scipy's, without preconditioner): Lanczos three-term
    recurrence, Givens rotations; 2 all-reduces per iteration (alpha needs y before its last
    update, beta needs it after). Stops on the recurrence's residual norm phibar."""
    sw = op.sw
    n = op.n_owned
    eps = np.finfo(np.float64).eps
    x = op.new()
    bnorm = math.sqrt(op.dots([(b, b)])[0])
    tol = rtol * bnorm
    v_ext = op.new_ext()
    v = v_ext[:n]
    r1, r2, y = b.clone(), b.clone(), op.new()  # without a preconditioner, scipy's y is r2
    w, w1, w2 = op.new(), op.new(), op.new()
    beta1 = bnorm
    oldb, beta, dbar, epsln, phibar = 0.0, beta1, 0.0, 0.0, beta1
    cs, sn = -1.0, 0.0
    k = 0
    mark = marker(sw)
    while phibar > tol and k < maxiter and beta > 0:
        mark()
        k += 1
        with sw("vector"):
            torch.mul(r2, 1.0 / beta, out=v)
        op.matvec(v_ext, y)
        if k >= 2:
            with sw("vector"):
                y.add_(r1, alpha=-beta / oldb)
        alfa = op.dots([(v, y)])[0]
        with sw("vector"):
            y.add_(r2, alpha=-alfa / beta)
        r1, r2, y = r2, y, r1  # rotate buffers instead of copying; old r1 is free now
        oldb = beta
        beta = math.sqrt(max(op.dots([(r2, r2)])[0], 0.0))
        oldeps = epsln
        delta = cs * dbar + sn * alfa
        gbar = sn * dbar - cs * alfa
        epsln = sn * beta
        dbar = -cs * beta
        gamma = max(math.hypot(gbar, beta), eps)
        cs, sn = gbar / gamma, beta / gamma
        phi = cs * phibar
        phibar = sn * phibar
        w1, w2, w = w2, w, w1  # rotate buffers; the new w overwrites the oldest
        with sw("vector"):
            torch.add(v, w1, alpha=-oldeps, out=w)
            w.add_(w2, alpha=-delta).mul_(1.0 / gamma)
            x.add_(w, alpha=phi)
    return Solution(x, k, phibar <= tol, phibar / bnorm if bnorm else 0.0)


METHODS = {"cg": cg, "pipecg": pipecg, "pcg": pcg, "bicgstab": bicgstab, "gmres": gmres, "minres": minres}


def solve(method: str, op: DistOperator, b: torch.Tensor, *, rtol: float, maxiter: int,
          restart: int = 30) -> Solution:
    """Run ``method`` (a name in :data:`METHODS`)."""
    if method == "gmres":
        return gmres(op, b, rtol, maxiter, restart=restart)
    return METHODS[method](op, b, rtol, maxiter)
