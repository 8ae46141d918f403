"""Rank side: how the distributed operator's messages travel.

The operator needs two things from a transport: ``exchange_start(sends, recvs, fill)``, which
posts one halo exchange (``sends``: ``[(tensor, dst), ...]``, ``recvs``: ``[(tensor, src), ...]``,
``fill(i)`` gathering send ``i``'s values) and
returns the requests (each with ``wait()``, waited later so that work can overlap the
messages), and ``all_reduce(tensor, async_op=False)``. Two transports provide them:

* ``torch``: ``torch.distributed`` itself (gloo on CPU, nccl on GPU). Works everywhere, across
  nodes; on nccl an exchange is one ``batch_isend_irecv`` (see :data:`GLOO_BATCHED`). On a
  CPU node every gloo message passes through gloo's own threads: the socket loop receives it,
  the process group's worker runs the all-reduce, and the waiting compute thread is woken.
  Each hand-off is a thread wake-up, which on a machine whose cores are all computing waits
  for a time slice to end (``docs/measurements.md``, solve, has what that cost on 2 cores).
* ``shm``: ranks on one host write into each other's mailboxes in a shared-memory segment and
  poll a sequence number, as MPI's shared-memory transports do. No thread, no system call, no
  socket: a message costs a memory copy and the time until the peer polls. It needs every
  rank on one host, CPU tensors, and x86-64 (its total store order makes "write the data, then
  the sequence number" safe without explicit fences; elsewhere ``auto`` uses ``torch``).

:func:`make_transport` picks one (``auto``: ``shm`` where it can work, else ``torch``); the
solve rows record which (``transport``).

Protocol of :class:`ShmTransport`. Each ordered pair (sender q, receiver p) with a message has a
mailbox of two slots, a sequence number written by q and an acknowledgement written by p.
Message m goes into slot m % 2; q first waits until p acknowledged message m - 2 (the last one
in that slot), writes the data, then sets seq = m; p waits until seq >= m, copies the slot out,
then sets ack = m. The all-reduce is the same idea with one slot per rank and round parity:
every rank publishes its values, waits until all have published that round, and sums the
slots in rank order, so every rank gets bit-identical sums (the Krylov methods' scalar
recurrences rely on that). A rank cannot publish round m + 2 before every rank has published
round m + 1, which each does only after reading round m: two parities are enough.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import platform
import time
import uuid

import numpy as np
import torch
import torch.distributed as dist

from labkit.runtime import pg_timeout_s
from labkit.solve.config import TRANSPORTS

MAX_REDUCE = 16  # default capacity of one all-reduce, in doubles (GMRES(m) needs m + 1)


class _Done:
    def wait(self):
        return None


#: how :class:`TorchTransport` posts a halo exchange on gloo: False, each irecv and then each
#: isend as a call of its own; True, all of them in one ``batch_isend_irecv``. gloo cannot
#: coalesce, so the batch posts the same calls in the same order and differs by its wrapper
#: only (benchmarks/halo_bench.py times both). Every other backend batches: nccl orders a pair's
#: sends and receives on one stream, where separately posted ones can deadlock.
GLOO_BATCHED = False


class TorchTransport:
    """``torch.distributed`` (gloo or nccl): the default process group.

    ``batched``: post an exchange as one ``batch_isend_irecv`` (True) or as separate irecv
    and isend calls (False); None, the default: decided by the process group's backend at the
    first exchange (:data:`GLOO_BATCHED` on gloo, batched elsewhere).
    """

    name = "torch"

    def __init__(self, batched: bool | None = None):
        self.batched = batched

    def exchange_start(self, sends, recvs, fill=None) -> list:
        """Post one exchange: receive into each ``(tensor, src)`` of ``recvs``, send each
        ``(tensor, dst)`` of ``sends``; the requests, receives first, to wait on later.
        ``fill(i)``, where given, fills send ``i``'s tensor: posted separately, right before
        that send (the receives are already out while the rank gathers), batched, all first."""
        if self.batched is None:
            self.batched = GLOO_BATCHED if dist.get_backend() == "gloo" else True
        if not self.batched:
            reqs = [dist.irecv(t, src=q) for t, q in recvs]
            for i, (t, q) in enumerate(sends):
                if fill is not None:
                    fill(i)
                reqs.append(dist.isend(t, dst=q))
            return reqs
        for i in range(len(sends) if fill is not None else 0):
            fill(i)
        ops = ([dist.P2POp(dist.irecv, t, q) for t, q in recvs]
               + [dist.P2POp(dist.isend, t, q) for t, q in sends])
        return dist.batch_isend_irecv(ops) if ops else []

    def all_reduce(self, tensor, async_op=False):
        return dist.all_reduce(tensor, async_op=async_op)

    def close(self):
        pass


class PeerTimeout(RuntimeError):
    """A peer did not post its message in time (it died, or is stuck elsewhere)."""


class ShmTransport:
    """Shared-memory mailboxes between the ranks of one host; see the module docstring.

    Collective to construct: every rank passes how many float64 values it sends to each peer
    (``send_counts``, peer -> count) and receives from each (``recv_counts``);
    ``max_reduce``: the most values one all-reduce carries.
    """

    name = "shm"

    def __init__(self, rank: int, world_size: int, send_counts: dict, recv_counts: dict,
                 timeout_s: float = 600.0, spin: int = 2000, max_reduce: int = MAX_REDUCE):
        self.rank, self.world_size = rank, world_size
        self.max_reduce = K = int(max_reduce)
        self.timeout_s, self.spin = float(timeout_s), int(spin)
        table = [None] * world_size
        dist.all_gather_object(table, {int(q): int(n) for q, n in send_counts.items()})
        for q, n in recv_counts.items():  # both sides must agree, or messages would be cut
            if table[q].get(rank) != int(n):
                raise ValueError(f"rank {rank} expects {n} values from rank {q}, which sends "
                                 f"{table[q].get(rank)}")
        # layout (in float64 words): [rank seqs | reduce slots] then one mailbox per pair
        self._seq_at = 0
        self._red_at = world_size
        off = self._red_at + world_size * 2 * K
        self._box = {}
        for q in range(world_size):
            for p, n in sorted(table[q].items()):
                self._box[(q, p)] = off  # seq, ack, slot 0 (n), slot 1 (n)
                off += 2 + 2 * n
        self._map = self._open(8 * max(off, 1))
        # numpy views of the segment: a message is a few hundred values and the all-reduce a few,
        # so the copies cost their call overhead, ~0.5 us in numpy against ~3 us in torch
        self._words = np.frombuffer(self._map, dtype=np.int64, count=off)
        self._f64 = np.frombuffer(self._map, dtype=np.float64, count=off)
        self._sent = {p: 0 for p in table[rank]}
        self._received = {q: 0 for q in recv_counts}
        self._round = 0
        self._counts = table

    def _open(self, nbytes: int) -> mmap.mmap:
        """Local rank 0 creates the segment; everyone maps it; then it is unlinked at once, so
        that no file outlives the launch, whatever happens to the ranks later."""
        name = [f"/dev/shm/labkit-{uuid.uuid4().hex}" if self.rank == 0 else None]
        dist.broadcast_object_list(name, src=0)
        path = name[0]
        if self.rank == 0:
            with open(path, "wb") as f:
                f.truncate(nbytes)
        dist.barrier()
        with open(path, "r+b") as f:
            m = mmap.mmap(f.fileno(), nbytes)
        dist.barrier()
        if self.rank == 0:
            os.unlink(path)
        return m

    # -- polling ---------------------------------------------------------------------------------
    def _until(self, where: int, value: int, peer: int) -> None:
        """Poll word ``where`` until it is >= ``value``: spin first, then yield the core (with
        more ranks than cores a pure spin would starve the peer it waits for)."""
        words = self._words
        if words[where] >= value:
            return
        for _ in range(self.spin):
            if words[where] >= value:
                return
        deadline = time.monotonic() + self.timeout_s
        while words[where] < value:
            os.sched_yield()
            if time.monotonic() > deadline:
                raise PeerTimeout(f"rank {self.rank}: no message from rank {peer} after "
                                  f"{self.timeout_s:.0f} s (did it fail?)")

    # -- point to point --------------------------------------------------------------------------
    def exchange_start(self, sends, recvs, fill=None) -> list:
        """Post one exchange (as :meth:`TorchTransport.exchange_start`): each receive is a
        request that polls its mailbox when waited on; each send (filled by ``fill(i)`` first,
        where given) writes into the peer's mailbox at once (after waiting for its slot to be
        free)."""
        reqs = [self.irecv(t, q) for t, q in recvs]
        for i, (t, q) in enumerate(sends):
            if fill is not None:
                fill(i)
            reqs.append(self.isend(t, q))
        return reqs

    def isend(self, tensor: torch.Tensor, dst: int):
        n = self._counts[self.rank].get(dst)
        if n is None or tensor.numel() != n:
            raise ValueError(f"rank {self.rank} -> {dst}: {tensor.numel()} values, mailbox {n}")
        base = self._box[(self.rank, dst)]
        m = self._sent[dst] + 1
        self._until(base + 1, m - 2, dst)  # the receiver has emptied this slot
        slot = base + 2 + (m % 2) * n
        self._f64[slot:slot + n] = tensor.numpy()
        self._words[base] = m  # after the data: x86 stores become visible in program order
        self._sent[dst] = m
        return _Done()

    def irecv(self, tensor: torch.Tensor, src: int):
        return _Pending(self._finish_recv, tensor, src)

    def _finish_recv(self, tensor: torch.Tensor, src: int) -> None:
        base = self._box[(src, self.rank)]
        n = self._counts[src][self.rank]
        m = self._received[src] + 1
        self._until(base, m, src)
        slot = base + 2 + (m % 2) * n
        tensor.numpy()[:] = self._f64[slot:slot + n]
        self._words[base + 1] = m
        self._received[src] = m

    # -- all-reduce ------------------------------------------------------------------------------
    def all_reduce(self, tensor: torch.Tensor, async_op: bool = False):
        k = tensor.numel()
        if k > self.max_reduce:
            raise ValueError(f"shm all-reduce carries at most {self.max_reduce} values, got {k}")
        self._round += 1
        m = self._round
        at = self._red_at + (self.rank * 2 + m % 2) * self.max_reduce
        self._f64[at:at + k] = tensor.numpy().reshape(-1)
        self._words[self._seq_at + self.rank] = m
        req = _Pending(self._finish_reduce, tensor, m)
        if async_op:
            return req
        req.wait()
        return None

    def _finish_reduce(self, tensor: torch.Tensor, m: int) -> None:
        k = tensor.numel()
        for q in range(self.world_size):
            self._until(self._seq_at + q, m, q)
        parts = [self._red_at + (q * 2 + m % 2) * self.max_reduce
                 for q in range(self.world_size)]
        total = self._f64[parts[0]:parts[0] + k].copy()
        for at in parts[1:]:  # rank order on every rank: identical sums everywhere
            total += self._f64[at:at + k]
        tensor.numpy().reshape(-1)[:] = total

    def close(self) -> None:
        self._words = self._f64 = None
        # a view may still exist somewhere; then the mapping dies with the process
        with contextlib.suppress(BufferError):
            self._map.close()


class _Pending:
    """A request whose ``wait()`` finishes the operation once (polls, then copies out)."""

    def __init__(self, finish, *args):
        self.finish, self.args = finish, args

    def wait(self):
        if self.finish is not None:
            self.finish(*self.args)
            self.finish = None


def shm_possible(world_size: int, local_world_size: int, device: torch.device) -> str | None:
    """Why the shm transport cannot work here, or None where it can."""
    if device.type != "cpu":
        return f"tensors live on {device.type}"
    if local_world_size != world_size:
        return "ranks span several hosts"
    if platform.machine() not in ("x86_64", "AMD64"):
        return f"{platform.machine()} has no total store order"
    if not os.path.isdir("/dev/shm"):
        return "no /dev/shm"
    return None


def make_transport(kind: str, rt, send_counts: dict, recv_counts: dict,
                   timeout_s: float | None = None, max_reduce: int = MAX_REDUCE):
    """The transport ``kind`` (``auto``, ``torch`` or ``shm``) for this rank's operator; shm
    waits ``timeout_s`` for a peer (default: the process group's, :func:`pg_timeout_s`)."""
    if kind not in TRANSPORTS:
        raise ValueError(f"unknown transport {kind!r} (one of {', '.join(TRANSPORTS)})")
    if kind == "torch" or rt.world_size == 1:
        return TorchTransport()
    why = shm_possible(rt.world_size, rt.local_world_size, rt.device)
    if why is not None:
        if kind == "shm":
            raise ValueError(f"transport shm is not possible: {why}")
        return TorchTransport()
    return ShmTransport(rt.rank, rt.world_size, send_counts, recv_counts,
                        timeout_s=pg_timeout_s() if timeout_s is None else timeout_s,
                        max_reduce=max_reduce)
