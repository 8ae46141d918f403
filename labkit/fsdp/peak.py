"""Rank side: what one rank holds over one training step, counted, and where it holds the most.

``with StepMemory(model, opt) as mem: step()`` counts, at every sample, the bytes of each
storage the rank holds, once and at its current size (a storage FSDP has freed after an
all-gather counts 0):

* ``params``: the optimizer's parameters (FSDP: the local shards) and the module's current
  ones (FSDP: a unit's gathered, unsharded weights while it holds them);
* ``gradients``: their ``.grad`` (FSDP: the unsharded gradients before their reduce-scatter,
  then the shards), ZeRO-2's gradient slices;
* ``optimizer``: Adam's states (the ZeRO optimizers' slices of m and v);
* ``buffers``: DDP's gradient buckets (the reducer keeps one flat copy of the gradients), the
  transient reduce-scatter buffers of the hand-written ZeRO optimizers, FSDP2's all-gather
  output before it is copied out (the unit backward prefetches) and the reduce-scatter inputs
  it keeps (:func:`fsdp_buffers`);
* ``activations``: the saved activations alive (:class:`labkit.memory.SavedActivations`: one
  meter per layer that excludes the layer's weights as it holds them then, FSDP's gathered
  ones included, and one for the rest of the step; with activation checkpointing a single
  meter, the checkpoint's own hooks being the innermost inside a layer).

The samples: every layer's entry and exit in forward (the exit before FSDP reshards), in
backward its entry (the gradient of its output ready, after FSDP has gathered it again) and
its exit (its input's gradient ready, before FSDP reduce-scatters), every reduce-scatter of
ZeRO-1/2 (with its buffers), the model's output (``forward end``), the loss (derived: the
forward end's holdings plus what the loss saved, which no hook sees), and whatever the caller
samples (:meth:`StepMemory.sample`: after the step). The peak is the largest sample: temporaries inside an operator
(a matrix product's output before it is saved, Adam's) fall between samples.
"""

from __future__ import annotations

import torch

from labkit.memory import SavedActivations
from labkit.tp.models import local_tensor

KINDS = ("params", "gradients", "optimizer", "buffers", "activations")


def _key(t) -> tuple | None:
    """(storage address, current bytes) of ``t``'s local storage; None for no tensor."""
    if t is None:
        return None
    s = local_tensor(t).untyped_storage()
    return (s.data_ptr(), s.nbytes())


def ddp_bucket_bytes(model) -> int:
    """Bytes of DDP's gradient buckets (0 for any other model)."""
    get = getattr(model, "_get_ddp_logging_data", None)
    if get is None:
        return 0
    sizes = str(get().get("bucket_sizes", ""))
    return sum(int(x) for x in sizes.replace(",", " ").split())


def fsdp_buffers(model) -> list:
    """FSDP2's communication buffers alive now: a unit's all-gather output not yet copied into
    its parameters (what backward prefetches) and the reduce-scatter inputs it keeps (each until
    the next unit's reduce-scatter). Read from FSDP2's internals (torch 2.13); where they are
    not found, none."""
    out = []
    for m in model.modules():
        get = getattr(m, "_get_fsdp_state", None)
        if get is None:
            continue
        for group in getattr(get(), "_fsdp_param_groups", None) or ():
            result = getattr(group, "_all_gather_result", None)
            if result is not None:
                out.append(result.all_gather_output)
            for rs in getattr(getattr(group, "comm_ctx", None), "reduce_scatter_states", ()):
                out.append(rs.reduce_scatter_input)
    return out


class StepMemory:
    """Samples what the rank holds during the step run inside ``with`` (see the module).

    ``samples``: one dict per sample (``label`` and the bytes of each of :data:`KINDS`,
    ``total``); :attr:`peak`: the largest. ``layers``: the modules sampled (default
    ``model.layers``, unwrapping DDP)."""

    def __init__(self, model, opt, *, layers=None, checkpoint: bool = False):
        inner = getattr(model, "module", model)
        self.model, self.opt = model, opt
        self.layers = list(layers if layers is not None else inner.layers)
        self.checkpoint = checkpoint
        self.bucket_bytes = ddp_bucket_bytes(model)
        self.samples: list[dict] = []
        self._meters: list[SavedActivations] = []
        self._open: dict = {}
        self._handles: list = []

    # ---------------------------------------------------------------- counting
    def _opt_params(self) -> list:
        params = getattr(self.opt, "params", None)
        if params is None:
            params = [p for g in self.opt.param_groups for p in g["params"]]
        return list(params)

    def _optimizer_tensors(self) -> list:
        if hasattr(self.opt, "exp_avg"):  # the hand-written ZeRO optimizers
            m, v = self.opt.exp_avg, self.opt.exp_avg_sq
            return [*m, *v] if isinstance(m, list) else [m, v]
        return [v for state in self.opt.state.values() for v in state.values()
                if isinstance(v, torch.Tensor)]

    def sample(self, label: str, transient=()) -> dict:
        """Count what is held now (``transient``: buffers alive only at this moment)."""
        seen: set = set()
        out = dict.fromkeys(KINDS, 0)

        def add(kind, t):
            k = _key(t)
            if k is not None and k not in seen:
                seen.add(k)
                out[kind] += k[1]

        params = self._opt_params() + list(self.model.parameters())
        for p in params:
            add("params", p)
        for p in params:
            add("gradients", p.grad)
        for g in getattr(self.opt, "grad_shards", None) or ():
            add("gradients", g)
        for t in self._optimizer_tensors():
            add("optimizer", t)
        for t in (*transient, *fsdp_buffers(self.model)):
            add("buffers", t)
        out["buffers"] += self.bucket_bytes
        out["activations"] = sum(m.live_bytes for m in self._meters)
        out["total"] = sum(out[k] for k in KINDS)
        out["label"] = label
        self.samples.append(out)
        return out

    @property
    def peak(self) -> dict:
        """The sample holding the most (its ``label`` says where)."""
        return max(self.samples, key=lambda s: s["total"])

    # ---------------------------------------------------------------- hooks
    def _hooks(self, i: int, layer) -> None:
        def pre(module, args):
            if not self.checkpoint:  # exclude the weights as the layer holds them now
                meter = SavedActivations(exclude=[local_tensor(p) for p in module.parameters()])
                self._meters.append(meter)
                self._open[i] = meter.__enter__()
            self.sample(f"layer {i} forward entry")
            for a in args:
                if isinstance(a, torch.Tensor) and a.requires_grad:
                    a.register_hook(lambda g: self._sampled(f"layer {i} backward exit", g))

        def exit_(module, args, output):  # before FSDP's post-forward reshards
            meter = self._open.pop(i, None)
            if meter is not None:
                meter.__exit__(None, None, None)
            self.sample(f"layer {i} forward exit")

        def after(module, args, output):  # after FSDP's: its pre-backward hook runs first
            if isinstance(output, torch.Tensor) and output.requires_grad:
                output.register_hook(lambda g: self._sampled(f"layer {i} backward entry", g))

        self._handles += [layer.register_forward_pre_hook(pre),
                          layer.register_forward_hook(exit_, prepend=True),
                          layer.register_forward_hook(after)]

    def _sampled(self, label: str, grad):
        self.sample(label)
        return grad

    def _forward_end(self, module, args, output) -> None:
        self._end = self.sample("forward end")
        self._end_outer = self._outer.live_bytes
        self._outer.reset_peak()  # from here the outer meter rises only by what the loss saves

    def _loss_sample(self) -> None:
        """The loss, derived: the forward end's holdings plus what the loss saved (no hook
        runs between the model's output and backward)."""
        if self._end is None:
            return
        rise = max(0, self._outer.peak_bytes - self._end_outer)
        loss = {**self._end, "label": "loss", "activations": self._end["activations"] + rise}
        loss["total"] = sum(loss[k] for k in KINDS)
        self.samples.insert(self.samples.index(self._end) + 1, loss)

    def __enter__(self) -> StepMemory:
        for i, layer in enumerate(self.layers):
            self._hooks(i, layer)
        self._end = None
        self._handles.append(self.model.register_forward_hook(self._forward_end))
        if hasattr(self.opt, "probe"):
            self.opt.probe = self.sample
        outer = SavedActivations(exclude=[local_tensor(p) for p in (
            *self._opt_params(), *self.model.parameters())])
        self._meters.append(outer)
        self._outer = outer.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._outer.__exit__(*exc)
        self._loss_sample()
        for h in self._handles:
            h.remove()
        self._handles = []
        if hasattr(self.opt, "probe"):
            self.opt.probe = None
