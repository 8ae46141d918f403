"""Rank side: when each layer's forward and backward and each collective of a sharded training
step ran (:class:`StepRecorder`), for the lab's Chrome trace (:mod:`labkit.fsdp.trace`).

Hooks on every layer stamp its forward's start (after FSDP's pre-forward: its weights
gathered) and end (before FSDP's post-forward frees them again), its backward's start (its
output's gradient arrived, before FSDP gathers the weights for it) and end (its input's
gradient computed, before FSDP reduce-scatters its gradients). Every collective of the
variant is stamped at its entry and exit: FSDP2's all-gathers and reduce-scatters through its
public hooks for custom collectives (``set_custom_all_gather``, ``set_custom_reduce_scatter``:
its own defaults, wrapped, bracketed by two stamps), the hand-written ZeRO-1 and
ZeRO-2 optimizers' through their ``recorder``. DDP's all-reduces run inside its C++ reducer,
out of reach of a stamp that changes nothing: DDP is not recorded (the DDP lab traces them).

A stamp is one ``time.perf_counter()`` read on a CPU and one CUDA event on the current stream
on a GPU (for a collective, the stream FSDP issues it on), read once the step is over. On a
CPU every collective blocks the calling thread (gloo, ``async_op=False``); on a GPU it runs
on its own stream beside the compute.
"""

from __future__ import annotations

import functools

import torch

from labkit import timing


class _Mark(torch.autograd.Function):
    """Identity whose backward calls ``cb``: where a layer's input gradient is ready."""

    @staticmethod
    def forward(ctx, x, cb):
        ctx.cb = cb
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.cb()
        return grad, None


class _Timed:
    """One of FSDP2's collectives of a unit (a layer), stamped: ``inner`` (the unit's own,
    its default) does the work and allocates its buffers, as before."""

    def __init__(self, inner, recorder, layer: int, op: str):
        self.inner, self.recorder, self.layer, self.op = inner, recorder, layer, op

    def allocate(self, *args, **kwargs):
        return self.inner.allocate(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        if self.op == "all_gather":
            name = f"AG L{self.layer} ({'bwd' if self.recorder.in_backward else 'fwd'})"
        else:
            name = f"RS L{self.layer}"
        return self.recorder.collective(name, self.op,
                                        functools.partial(self.inner, *args, **kwargs))


def fsdp_collectives(layer) -> tuple | None:
    """A ``fully_shard`` module's own all-gather and reduce-scatter (read from its internals,
    torch 2.13: its one parameter group's), or None where they are not found (a module with
    no parameters of its own, another torch)."""
    get = getattr(layer, "_get_fsdp_state", None)
    groups = getattr(get(), "_fsdp_param_groups", None) if get is not None else None
    if not groups or len(groups) != 1:
        return None
    ag = getattr(groups[0], "_all_gather_comm", None)
    rs = getattr(groups[0], "_reduce_scatter_comm", None)
    return None if ag is None or rs is None else (ag, rs)


def _time_fsdp_collectives(layer, recorder, i: int) -> bool:
    """Route a ``fully_shard`` layer's all-gather and reduce-scatter through :class:`_Timed`
    (FSDP2's ``set_custom_all_gather`` / ``set_custom_reduce_scatter``), wrapping its own
    (:func:`fsdp_collectives`); False, changing nothing, where they are not found."""
    found = fsdp_collectives(layer)
    if found is None:
        return False
    ag, rs = found
    layer.set_custom_all_gather(_Timed(ag, recorder, i, "all_gather"))
    layer.set_custom_reduce_scatter(_Timed(rs, recorder, i, "reduce_scatter"))
    recorder.restore.append(functools.partial(_restore, layer, ag, rs))
    return True


def _restore(layer, ag, rs) -> None:
    layer.set_custom_all_gather(ag)
    layer.set_custom_reduce_scatter(rs)


class StepRecorder:
    """Stamps the steps run through :meth:`timed` of one variant's ``model`` and ``opt`` (see
    the module); :meth:`record` gives one step's marks, :meth:`close` removes the hooks.
    ``variant``: ``fsdp``, ``zero1``, ``zero2`` (DDP: see the module)."""

    def __init__(self, model, opt, variant: str, device: torch.device):
        self.cuda = torch.device(device).type == "cuda"
        self.in_backward = False
        self._steps: list = []
        self._now: list | None = None
        self._handles = []
        self.restore: list = []  # what puts FSDP's own collectives back
        for i, layer in enumerate(model.layers):
            # appended: after FSDP's pre-forward; prepended: before its post-forward
            self._handles += [layer.register_forward_pre_hook(functools.partial(self._enter, i)),
                              layer.register_forward_hook(functools.partial(self._leave, i),
                                                          prepend=True)]
            if variant == "fsdp":
                _time_fsdp_collectives(layer, self, i)
        if variant in ("zero1", "zero2"):
            opt.recorder = self
        self._opt = opt

    def _stamp(self):
        return timing.stamp("cuda" if self.cuda else "cpu")

    def _mark(self, kind: str, layer: int) -> None:
        if self._now is not None:
            self._now.append((kind, layer, self._stamp()))

    def _enter(self, i: int, module, args):
        self._mark("fwd_start", i)
        x, *rest = args
        return (_Mark.apply(x, functools.partial(self._mark, "bwd_end", i)), *rest)

    def _leave(self, i: int, module, args, out):
        self._mark("fwd_end", i)
        if out.requires_grad:
            out.register_hook(functools.partial(self._backward_starts, i))

    def _backward_starts(self, i: int, grad) -> None:
        self.in_backward = True
        self._mark("bwd_start", i)

    def collective(self, name: str, op: str, run):
        """``run()``, one synchronous collective ``op``, stamped at its entry and exit."""
        if self._now is None:
            return run()
        entry = self._stamp()
        out = run()
        self._now.append(("collective", (name, op), entry, self._stamp()))
        return out

    def timed(self, step):
        """``step`` with its start and end stamped and everything in between recorded."""
        def run():
            self.in_backward, self._now = False, []
            start = self._stamp()
            step()
            self._steps.append((start, self._stamp(), self._now))
            self._now = None
        return run

    def record(self, k: int) -> dict:
        """The ``k``-th recorded step (negative: from the last; on CUDA once the device is
        idle): ``origin_s`` (its start on the host's monotonic clock; 0 on CUDA), ``end_s``,
        ``marks`` (``kind, layer, at_s``: a layer's ``fwd_start``, ``fwd_end``,
        ``bwd_start``, ``bwd_end``) and ``collectives`` (``name, op, entry_s, exit_s``),
        seconds from the step's start, and ``blocking`` (the collectives held the thread)."""
        start, end, now = self._steps[k]

        def since(stamp):
            return timing.seconds_between(start, stamp)

        marks = [{"kind": e[0], "layer": e[1], "at_s": since(e[2])} for e in now
                 if e[0] != "collective"]
        coll = [{"name": e[1][0], "op": e[1][1], "entry_s": since(e[2]), "exit_s": since(e[3])}
                for e in now if e[0] == "collective"]
        return {"origin_s": start if isinstance(start, float) else 0.0, "end_s": since(end),
                "marks": marks, "collectives": coll, "blocking": not self.cuda}

    def close(self) -> None:
        """Remove the layers' hooks, FSDP's wrapped collectives and the optimizer's recorder."""
        for h in self._handles:
            h.remove()
        for undo in self.restore:
            undo()
        if hasattr(self._opt, "recorder"):
            self._opt.recorder = None
