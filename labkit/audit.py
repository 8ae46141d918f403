"""Rank side: the device audit, which checks on a CPU what NCCL will demand of a GPU rank.

On NCCL every tensor a rank hands to torch.distributed must live on its GPU; on gloo a host
tensor and a device tensor are both ``cpu``. With ``LABKIT_DEVICE_AUDIT=1``,
:func:`labkit.runtime.init` on a gloo rank declares the device ``cpu:0`` (a real CPU device,
so everything computes as before, that a call's arguments tell apart from the host's default)
and calls :func:`install`. Every tensor is tagged by its storage: on the device when made with
``device=cpu:0`` or moved there (``.to(cpu:0)``, ``.to(t)`` of such a ``t``, ``.cuda()``), on
the host when made with no device or another one (``.cpu()``, ``.to("cpu")``, ``from_numpy``);
other results take their inputs' tag, and an operation mixing a host tensor (not 0-d) with a
device tensor fails, as it raises on CUDA (copies and indexing excepted). Tensors made where
Python does not see it (the gradients autograd's backward hands on) are unknown and pass; a
``.grad`` read takes its parameter's tag. In torch.distributed's own
code (DTensor, FSDP, the mesh; not pipelining, which uses the device it is given) ``cpu`` with
no index is the mesh's or the process group's device, the GPU on a cluster.

A host tensor handed to torch.distributed (or a host parameter to ``DistributedDataParallel``)
raises :class:`DeviceAuditError` naming the first frame outside torch. Each rank writes its
counts to ``rank<R>.audit.json`` in ``LABKIT_DEVICE_AUDIT_DIR`` (else ``LABKIT_STATUS_DIR``) at
``destroy_process_group`` and at a failure, so a test can check that it saw device tensors.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import threading
from collections import Counter
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.overrides import TorchFunctionMode, resolve_name

ENV, DIR_ENV = "LABKIT_DEVICE_AUDIT", "LABKIT_DEVICE_AUDIT_DIR"
HOST, DEVICE = "host", "device"  # a tag; None: unknown
_TORCH = os.path.dirname(torch.__file__) + os.sep
_DIST, _PIPELINING = _TORCH + "distributed" + os.sep, _TORCH + "distributed/pipelining" + os.sep
_OVERRIDES = _TORCH + "overrides.py"
_PASSING = {_TORCH + "utils/_device.py", _TORCH + "_tensor.py", __file__}
_ROOT = str(Path(__file__).resolve().parent.parent) + os.sep
CHECKED = ("send", "recv", "isend", "irecv", "all_reduce", "all_gather", "all_gather_into_tensor",
           "all_gather_single", "reduce_scatter", "reduce_scatter_tensor",
           "reduce_scatter_single", "all_to_all", "all_to_all_single", "broadcast", "reduce",
           "gather", "scatter", "batch_isend_irecv", "barrier")
OBJECTS = ("all_gather_object", "gather_object", "broadcast_object_list", "scatter_object_list",
           "send_object_list", "recv_object_list")  # torch picks their tensors' device itself
#: calls that may take a host and a device tensor on CUDA: copies, indexing, metadata
_LEGAL_MIX = {torch.Tensor.copy_, torch._foreach_copy_, torch.Tensor.__getitem__,
              torch.Tensor.__setitem__, torch.Tensor.new_tensor, torch.Tensor.set_,
              torch._has_compatible_shallow_copy_type, torch.is_same_size}
_AUDIT: Audit | None = None


class DeviceAuditError(RuntimeError):
    """A host tensor where a rank's device tensor must be."""


def enabled() -> bool:
    return os.environ.get(ENV, "") not in ("", "0")


def _tensors(tree) -> list:
    """The tensors of call arguments or results, lists and tuples of them included."""
    out = []
    for x in tree:
        if isinstance(x, torch.Tensor):
            out.append(x)
        elif isinstance(x, (list, tuple)):
            out += _tensors(x)
        elif isinstance(x, dict):
            out += _tensors(x.values())
    return out


def _storage(t):
    t = getattr(t, "_local_tensor", t)  # a DTensor's data is its shard
    try:
        if t.is_meta:
            return None
        if t.layout != torch.strided:  # sparse: its values
            t = t._values() if t.layout == torch.sparse_coo else t.values()
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError, AttributeError, TypeError):
        return None


def _caller(skip_torch: bool = False) -> tuple[str, int]:
    """(file, line) of the code that made the current call: past the audit, torch's dispatch
    to it and the Python function that dispatched; with ``skip_torch`` past torch entirely."""
    f = sys._getframe(1)
    while f is not None:
        name = f.f_code.co_filename
        if name == _OVERRIDES:
            while f is not None and f.f_code.co_filename == _OVERRIDES:
                f = f.f_back
            f = f.f_back if f is not None else None  # the function that handed the call over
        elif name in _PASSING or (skip_torch and name.startswith(_TORCH)):
            f = f.f_back
        else:
            return name, f.f_lineno
    return "?", 0


def _describe(t) -> str:
    return f"shape {tuple(t.shape)}, {t.dtype}"


class Audit(TorchFunctionMode):
    """The tags, the counts and the checks of one rank (see the module's docstring)."""

    def __init__(self, device: torch.device, *, rank: int, local_rank: int):
        super().__init__()
        self.device, self.rank, self.local_rank = device, rank, local_rank
        self.tags: dict[int, tuple] = {}  # storage id -> (tag, the storage if host)
        self.counts = dict(calls=0, tensors=0, on_device=0, unknown=0, ops_on_device=0,
                           ops_on_host=0)
        self.host_ops: Counter = Counter()
        self.failures: list[str] = []
        self._inside = threading.local()  # set while torch.distributed runs a wrapped call
        self._saved: list[tuple] = []

    # -- tags ----------------------------------------------------------------------------------
    def tag_of(self, t) -> str | None:
        s = _storage(t)
        entry = self.tags.get(s._cdata) if s is not None else None
        return entry[0] if entry else None

    def _device_tag(self, device) -> str | None:
        """The tag of a tensor made on or moved to ``device``; None: unknown."""
        if not isinstance(device, (str, torch.device)):
            return HOST  # an index alone names a GPU: never this rank's cpu:0
        d = torch.device(device)
        if d == self.device:
            return DEVICE
        if d.type == "meta":
            return None
        if d.type == self.device.type and d.index is None:
            where = _caller()[0]
            if where.startswith(_DIST) and not where.startswith(_PIPELINING):
                return DEVICE  # the mesh's or process group's device, cuda on a cluster
            if where.startswith(_TORCH):
                return None  # torch's own choice, not the lab's
        return HOST

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") in ("__get__", "__set__"):  # a Tensor property
            if (getattr(func.__self__, "__name__", "") == "device" and args
                    and self.tag_of(args[0]) == DEVICE and not _caller()[0].startswith(_TORCH)):
                return self.device  # what .device says on the GPU: cuda:LOCAL_RANK
            if func.__name__ == "__set__":
                return func(*args, **kwargs)
        ins = _tensors(args) + _tensors(kwargs.values())
        if func is torch.Tensor.cuda:  # cpu:0 stands for the GPU
            return self._placed(func, args[0].to(self.device), ins, DEVICE)
        if func is torch.Tensor.cpu:
            return self._placed(func, func(*args, **kwargs), ins, HOST)
        if func is torch.Tensor.to:
            return self._placed(func, func(*args, **kwargs), ins, self._to_tag(args, kwargs))
        if kwargs.get("device") is not None:
            tag = self._device_tag(kwargs["device"])
            return self._placed(func, func(*args, **kwargs), ins, tag)
        tag = self._inherited(func, args, ins)
        out = func(*args, **kwargs)
        results = _tensors(out if isinstance(out, (list, tuple)) else [out])
        if results and tag is not None:
            self._count(func, tag)
        mine = {s._cdata for s in map(_storage, ins) if s is not None}
        for t in results:
            s = _storage(t)
            if s is not None and s._cdata not in mine:  # views and in-place results keep theirs
                self._set(s, tag)
        return out

    def _to_tag(self, args, kwargs) -> str | None:
        other = args[1] if len(args) > 1 else kwargs.get("other")
        if isinstance(other, torch.Tensor):
            return self.tag_of(other)
        try:
            device = torch._C._nn._parse_to(*args[1:], **kwargs)[0]
        except (TypeError, RuntimeError):
            return None
        return None if device is None else self._device_tag(device)

    def _inherited(self, func, args, ins) -> str | None:
        """The tag an operation's outputs take from its inputs (fails on a mix)."""
        if func in _LEGAL_MIX:
            return self.tag_of(args[0]) if ins else None
        tags = [(t, self.tag_of(t)) for t in ins]
        on = [t for t, g in tags if g == DEVICE]
        host = [t for t, g in tags if g == HOST]
        big = [t for t in host if t.dim() > 0]  # a 0-d host tensor is a scalar, also on CUDA
        if on and big:
            self.fail(f"mixed a host tensor ({_describe(big[0])}) with a device tensor "
                      f"({_describe(on[0])}) in {resolve_name(func) or func.__name__}",
                      "on CUDA this raises: the tensors of one operation live on one device")
        if on:
            return DEVICE
        return HOST if host or not ins else None  # made from nothing: the host's default

    def _placed(self, func, out, ins, tag):
        """``out`` of a move or of a call given a device, tagged ``tag`` (None: its source's).
        Where torch returned the source itself (same device here), a copy, as on a GPU."""
        if not isinstance(out, torch.Tensor) or (s := _storage(out)) is None:
            return out
        src = next((t for t in ins if (i := _storage(t)) is not None and i._cdata == s._cdata),
                   None)
        if tag is None:
            tag = self.tag_of(ins[0]) if ins else None
        if src is not None:
            if tag == self.tag_of(src):
                return out
            out = out.clone()
            s = _storage(out)
        if tag is not None:
            self._count(func, tag)
        self._set(s, tag)
        return out

    def _count(self, func, tag: str) -> None:
        self.counts["ops_on_device" if tag == DEVICE else "ops_on_host"] += 1
        if tag == HOST:  # by name: a test can ask whether a lab's main work ran on the host
            self.host_ops[getattr(func, "__name__", "?")] += 1

    def _set(self, s, tag) -> None:
        if tag is None:
            self.tags.pop(s._cdata, None)
        else:  # host storages are kept alive: a freed address must not pass on a stale tag
            self.tags[s._cdata] = (tag, s if tag == HOST else None)

    # -- checks --------------------------------------------------------------------------------
    def fail(self, what: str, why: str) -> None:
        file, line = _caller(skip_torch=True)
        file = file[len(_ROOT):] if file.startswith(_ROOT) else file
        msg = (f"device audit: rank {self.rank} {what} at {file}:{line} (the first frame outside "
               f"torch); {why} (cpu:0 here stands for cuda:{self.local_rank})")
        self.failures.append(msg)
        self.write()
        raise DeviceAuditError(msg)

    def check(self, where: str, named: list[tuple[str, torch.Tensor]]) -> None:
        self.counts["calls"] += 1
        for label, t in named:
            tag = self.tag_of(t)
            self.counts["tensors"] += 1
            if tag == HOST:
                self.fail(f"passed a host tensor ({label}{_describe(t)}) to {where}",
                          "every tensor handed to torch.distributed must live on the rank's "
                          "device")
            self.counts["on_device" if tag == DEVICE else "unknown"] += 1

    @contextlib.contextmanager
    def _torch_calls(self):
        """torch.distributed's own calls inside this block are torch's business: unchecked."""
        depth = getattr(self._inside, "depth", 0)
        self._inside.depth = depth + 1
        try:
            yield depth == 0
        finally:
            self._inside.depth = depth

    def _wrap(self, name: str, orig, check: bool):
        @functools.wraps(orig)
        def wrapped(*args, **kwargs):
            with self._torch_calls() as outermost:
                if check and outermost:
                    with torch._C.DisableTorchFunction():
                        self.check_call(name, args, kwargs)
                return orig(*args, **kwargs)
        return wrapped

    def check_call(self, name: str, args, kwargs) -> None:
        if name == "batch_isend_irecv":
            ops = list(args[0] if args else kwargs["p2p_op_list"])
            for op in ops:  # a P2POp made with the unwrapped function: batch_isend_irecv
                op.op = {c10d.isend.__wrapped__: c10d.isend,  # tells isend by identity
                         c10d.irecv.__wrapped__: c10d.irecv}.get(op.op, op.op)
            return self.check(f"dist.{name}", [(
                f"isend to rank {op.peer}, " if op.op is c10d.isend else
                f"irecv from rank {op.peer}, ", op.tensor) for op in ops])
        self.check(f"dist.{name}", [("", t) for t in _tensors(args) + _tensors(kwargs.values())])

    def check_module(self, module, where: str) -> None:
        named = [*module.named_parameters(), *module.named_buffers()]
        self.check(where, [(f"{n}, ", t) for n, t in named])

    # -- installing, results -------------------------------------------------------------------
    def _patch(self, owner, name: str, value) -> None:
        self._saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    def _replace(self, owners, name: str, orig, wrapped) -> None:
        for owner in owners:
            self._patch(owner, name, wrapped)
        # labkit modules imported before init may hold the function itself
        for mod in [m for k, m in sys.modules.items() if k.startswith("labkit.")]:
            for attr, value in list(vars(mod).items()):
                if value is orig:
                    self._patch(mod, attr, wrapped)

    def _host_factory(self, orig):
        """``torch.from_numpy`` and the like, which never reach a mode: host tensors."""
        @functools.wraps(orig)
        def made_on_host(*args, **kwargs):
            out = orig(*args, **kwargs)
            if (s := _storage(out)) is not None:
                self._set(s, HOST)
            return out
        return made_on_host

    def install(self) -> Audit:
        from torch.nn.parallel import DistributedDataParallel as DDP

        for name, check in [*((n, True) for n in CHECKED), *((n, False) for n in OBJECTS)]:
            orig = getattr(c10d, name, None)
            if orig is not None:
                self._replace([c10d, dist], name, orig, self._wrap(name, orig, check))
        for name in ("from_numpy", "frombuffer"):
            orig = getattr(torch, name)
            self._replace([torch], name, orig, self._host_factory(orig))
        ddp_init = DDP.__init__

        @functools.wraps(ddp_init)
        def checked_ddp(ddp, module, *args, **kwargs):
            with self._torch_calls() as outermost:
                if outermost:
                    with torch._C.DisableTorchFunction():
                        self.check_module(module, "DistributedDataParallel")
                return ddp_init(ddp, module, *args, **kwargs)
        self._patch(DDP, "__init__", checked_ddp)
        destroy = dist.destroy_process_group

        @functools.wraps(destroy)
        def destroy_and_write(*args, **kwargs):
            self.write()
            return destroy(*args, **kwargs)
        self._patch(dist, "destroy_process_group", destroy_and_write)
        self.__enter__()  # for the rest of the process
        return self

    def uninstall(self) -> None:
        self.__exit__(None, None, None)
        for owner, name, value in reversed(self._saved):
            setattr(owner, name, value)
        self._saved.clear()

    def summary(self) -> dict:
        return {"rank": self.rank, "device": str(self.device), **self.counts,
                "host_ops": dict(self.host_ops), "failures": list(self.failures)}

    def write(self) -> None:
        folder = os.environ.get(DIR_ENV) or os.environ.get("LABKIT_STATUS_DIR")
        if folder:
            path = Path(folder, f"rank{self.rank}.audit.json")
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(json.dumps(self.summary()))
            os.replace(tmp, path)


def install(device: torch.device, *, rank: int, local_rank: int) -> Audit:
    """Start auditing this process (once; :func:`uninstall` ends it): the mode, the wrapped
    torch.distributed calls and ``DistributedDataParallel``."""
    global _AUDIT
    if _AUDIT is None:
        _AUDIT = Audit(device, rank=rank, local_rank=local_rank).install()
    return _AUDIT


def uninstall() -> None:
    global _AUDIT
    if _AUDIT is not None:
        _AUDIT.uninstall()
        _AUDIT = None


def summary() -> dict | None:
    """This process's counts and failures, None when no audit runs."""
    return _AUDIT.summary() if _AUDIT is not None else None
