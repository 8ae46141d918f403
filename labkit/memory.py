"""Activation memory measured on a rank: the bytes autograd saves for backward.

:class:`SavedActivations` is a context manager (``torch.autograd.graph.saved_tensors_hooks``):
while it is open, every tensor autograd saves for backward on this thread is counted, each
storage once (keyed by its device, ``untyped_storage().data_ptr()`` and size: a tensor saved by
two operations, and a view saved beside its base, count once; a saved view counts its whole
storage, which it keeps alive), leaving out the storages of the tensors in ``exclude``
(parameters: they are held anyway, not activations; a batch held for the whole step). A saved
tensor stays counted until autograd frees it (the backward that used it, or the graph dropped):
``live_bytes`` is what is held now, ``peak_bytes`` the most held at once, ``saved_bytes`` all
that was saved (a storage counts again once it has been freed and saved anew). Wrapper
tensors (a ``DTensor``) count the storages of the tensors they wrap. Hooks that are already
open on the thread (activation checkpointing, offloading) are outside this meter's contract.

Why saved tensors and not a memory counter: device memory mixes activations with weights,
gradients, the allocator's cache and communication buffers, and a CPU has no such counter at
all; the saved tensors are exactly what an activation-memory formula counts, on every device,
to the byte. :func:`device_peak_bytes` and :func:`reset_device_peak` give the device's own
peak beside it (CUDA; None on a CPU). Pure formulas of activation bytes live in each lab's
``formulas.py``.
"""

from __future__ import annotations

import threading
import time
import weakref

import torch

from labkit.runtime import device_peak_bytes, reset_device_peak

__all__ = ["SavedActivations", "device_peak_bytes", "reset_device_peak"]


def _storages(t: torch.Tensor) -> dict:
    """{storage key: bytes} of the memory ``t`` holds: a wrapper subclass's inner tensors, a
    tensor without a storage by its own size."""
    if hasattr(t, "__tensor_flatten__"):  # a wrapper subclass (DTensor): its inner tensors
        names, _ = t.__tensor_flatten__()  # DTensor also lists its device mesh: not memory
        inner = [getattr(t, name) for name in names]
        return {k: n for x in inner if isinstance(x, torch.Tensor)
                for k, n in _storages(x).items()}
    try:
        s = t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return {("tensor", id(t)): t.numel() * t.element_size()}
    return {(t.device.type, t.device.index, s.data_ptr(), s.nbytes()): s.nbytes()}


class _Saved:
    """What autograd holds instead of a saved tensor: freed with the graph, and with it the
    meter's count."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor):
        self.tensor = tensor


class SavedActivations:
    """Counts the bytes autograd saves for backward on this thread while open (see the module's
    contract): ``live_bytes`` alive now, ``peak_bytes`` the most alive at once since opened (or
    since :meth:`reset_peak`), ``saved_bytes`` all packed since opened, and ``events``:
    (label, clock, live_bytes) of each :meth:`mark`. The counts go on falling after it is
    closed, as autograd frees what was saved while it was open.

    >>> import torch
    >>> lin = torch.nn.Linear(3, 3)
    >>> x = torch.ones(2, 3)
    >>> with SavedActivations(exclude=lin.parameters()) as meter:
    ...     loss = torch.tanh(lin(x)).sum()
    >>> meter.live_bytes  # x (2 x 3 floats) saved by the Linear, tanh's output saved by tanh
    48
    >>> loss.backward()
    >>> meter.live_bytes, meter.peak_bytes, meter.saved_bytes
    (0, 48, 48)
    """

    def __init__(self, exclude=(), *, clock=time.perf_counter):
        excluded = list(exclude)  # held: an excluded storage's address is never reused meanwhile
        self._exclude = {k for t in excluded for k in _storages(t)}
        self._held, self._clock = excluded, clock
        self._lock = threading.Lock()  # autograd may free saved tensors on its own threads
        self._live: dict = {}  # storage key -> [saved tensors holding it, bytes]
        self._hooks = None
        self.live_bytes = self.peak_bytes = self.saved_bytes = 0
        self.events: list[tuple[str, float, int]] = []

    def __enter__(self) -> SavedActivations:
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)
        self._hooks = None

    def reset_peak(self) -> None:
        """Start a new peak from what is alive now."""
        with self._lock:
            self.peak_bytes = self.live_bytes

    def mark(self, label: str) -> None:
        """Record (label, clock now, live_bytes) in :attr:`events`."""
        self.events.append((label, self._clock(), self.live_bytes))

    def _pack(self, tensor):
        keys = {k: n for k, n in _storages(tensor).items() if k not in self._exclude}
        if not keys:
            return tensor
        saved = _Saved(tensor)
        with self._lock:
            for key, size in keys.items():
                entry = self._live.get(key)
                if entry is None:
                    self._live[key] = [1, size]
                    self.live_bytes += size
                    self.saved_bytes += size
                else:
                    entry[0] += 1
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        weakref.finalize(saved, self._release, tuple(keys)).atexit = False
        return saved

    @staticmethod
    def _unpack(saved):
        return saved.tensor if isinstance(saved, _Saved) else saved

    def _release(self, keys) -> None:
        with self._lock:
            for key in keys:
                entry = self._live[key]
                entry[0] -= 1
                if entry[0] == 0:
                    del self._live[key]
                    self.live_bytes -= entry[1]
