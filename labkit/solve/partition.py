"""Who owns which row: the three partitioners, and what each rank needs from its neighbours (pure).

* ``simple``: contiguous blocks of global rows (x fastest), as even as possible. On a grid a
  block boundary is a whole grid line (plane in 3-D): the halo is one line per neighbour.
* ``coordinate``: recursive coordinate bisection (RCB): cut the point set across its longest
  extent at the point that splits the work in proportion to the parts on each side; recurse.
* ``metis``: multilevel graph partitioning (pymetis, an optional extra), minimising edge cut.

Per rank (:class:`LocalPart`): owned rows, the halo (values owned elsewhere that its rows
reference, received every SpMV), the ranks it exchanges with, and which of its own values each
neighbour needs. Over all ranks (:func:`partition_stats`): edge cut (grid edges whose ends have
different owners) and load imbalance (max owned rows / mean owned rows).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from labkit.errors import UsageError


def grid_neighbours(dims: tuple[int, ...], rows: np.ndarray) -> np.ndarray:
    """(len(rows), 2 * dim) global ids of each row's grid neighbours, -1 beyond the boundary.

    >>> grid_neighbours((3, 3), np.array([0, 4])).tolist()
    [[-1, 1, -1, 3], [3, 5, 1, 7]]
    """
    rows = np.asarray(rows, dtype=np.int64)
    out = np.empty((len(rows), 2 * len(dims)), dtype=np.int64)
    stride, rest = 1, rows
    for axis, n in enumerate(dims):
        c = rest % n
        rest = rest // n
        out[:, 2 * axis] = np.where(c > 0, rows - stride, -1)
        out[:, 2 * axis + 1] = np.where(c < n - 1, rows + stride, -1)
        stride *= n
    return out


@dataclass(frozen=True)
class LocalPart:
    """One rank's view. Local ids: owned rows 0..n_owned-1, then halo n_owned..n_owned+n_halo-1.

    The halo is sorted by (owner, global id), so each neighbour's values land in one contiguous
    slice; ``send[q]`` lists (by local id, in global order) the owned values neighbour ``q``
    expects, in the order it stores them.
    """

    rank: int
    owned: np.ndarray  # global ids, sorted
    halo: np.ndarray  # global ids, sorted by (owner, gid)
    neighbours: tuple  # ranks, ascending
    recv_counts: tuple  # halo values from each neighbour, aligned with ``neighbours``
    send: dict = field(default_factory=dict)  # neighbour -> local ids to send
    cut_edges: int = 0  # matrix entries in owned rows that point to another rank

    @property
    def n_owned(self) -> int:
        return len(self.owned)

    @property
    def n_halo(self) -> int:
        return len(self.halo)

    def local_ids(self, gids: np.ndarray) -> np.ndarray:
        """Map global ids (owned or halo; anything else is an error) to local ids."""
        gids = np.asarray(gids, dtype=np.int64)
        out = np.searchsorted(self.owned, gids)
        is_owned = (out < len(self.owned)) & (self.owned[np.minimum(out, len(self.owned) - 1)] == gids)
        if not is_owned.all():
            order = np.argsort(self.halo, kind="stable")
            sorted_halo = self.halo[order]
            rest = gids[~is_owned]
            pos = np.searchsorted(sorted_halo, rest)
            if (pos >= len(sorted_halo)).any() or (sorted_halo[np.minimum(pos, len(sorted_halo) - 1)] != rest).any():
                raise ValueError("a column is neither owned nor in the halo")
            out[~is_owned] = self.n_owned + order[pos]
        return out


@dataclass(frozen=True)
class Partition:
    """Owner of every global row of a grid. ``parts`` is None for ``simple`` (owner by arithmetic:
    no rank needs a global-sized array)."""

    kind: str
    dims: tuple
    nparts: int
    parts: np.ndarray | None = None

    @property
    def n(self) -> int:
        return math.prod(self.dims)

    def starts(self) -> np.ndarray:
        """Block starts of the simple partitioner (nparts + 1 values)."""
        q, r = divmod(self.n, self.nparts)
        sizes = np.full(self.nparts, q, dtype=np.int64)
        sizes[:r] += 1
        return np.concatenate([[0], np.cumsum(sizes)])

    def owner(self, gids: np.ndarray) -> np.ndarray:
        gids = np.asarray(gids, dtype=np.int64)
        if self.parts is None:
            return np.searchsorted(self.starts(), gids, side="right") - 1
        return self.parts[gids]

    def owned(self, rank: int) -> np.ndarray:
        if self.parts is None:
            s = self.starts()
            return np.arange(s[rank], s[rank + 1], dtype=np.int64)
        return np.flatnonzero(self.parts == rank).astype(np.int64)

    def local(self, rank: int) -> LocalPart:
        """Rank ``rank``'s owned rows, halo and send lists, from the stencil of its own rows."""
        owned = self.owned(rank)
        nb = grid_neighbours(self.dims, owned)
        src = np.repeat(owned, nb.shape[1])
        nb = nb.ravel()
        keep = nb >= 0
        src, nb = src[keep], nb[keep]
        own = self.owner(nb)
        off = own != rank
        src, nb, own = src[off], nb[off], own[off]
        halo = np.unique(nb)
        halo_owner = self.owner(halo)
        order = np.lexsort((halo, halo_owner))
        halo, halo_owner = halo[order], halo_owner[order]
        neighbours, counts = np.unique(halo_owner, return_counts=True)
        send = {}
        for q in neighbours:
            rows = np.unique(src[own == q])  # the symmetric stencil: q needs what touches q
            send[int(q)] = np.searchsorted(owned, rows)
        return LocalPart(rank=rank, owned=owned, halo=halo,
                         neighbours=tuple(int(q) for q in neighbours),
                         recv_counts=tuple(int(c) for c in counts), send=send,
                         cut_edges=int(off.sum()))


def make_partition(kind: str, dims: tuple[int, ...], nparts: int) -> Partition:
    """Partition the grid ``dims`` into ``nparts`` parts with ``kind``."""
    dims = tuple(int(d) for d in dims)
    n = math.prod(dims)
    if nparts < 1 or n < nparts:
        raise UsageError(f"cannot split {n} rows into {nparts} parts")
    if kind == "simple":
        return Partition(kind, dims, nparts)
    if kind == "coordinate":
        return Partition(kind, dims, nparts, rcb(dims, nparts))
    if kind == "metis":
        return Partition(kind, dims, nparts, metis_parts(dims, nparts))
    raise UsageError(f"unknown partitioner {kind!r} (simple, coordinate, metis)")


def rcb(dims: tuple[int, ...], nparts: int) -> np.ndarray:
    """Recursive coordinate bisection: part id of each global row.

    Each cut goes across the longest extent of the current point set; the left side gets
    ``k // 2`` of its ``k`` parts and that share of the points (ties broken by global id).

    >>> rcb((4, 2), 2).reshape(2, 4).tolist()
    [[0, 0, 1, 1], [0, 0, 1, 1]]
    """
    n = math.prod(dims)
    parts = np.zeros(n, dtype=np.int64)
    coords = np.stack(np.unravel_index(np.arange(n), dims[::-1])[::-1], axis=1)
    stack = [(np.arange(n, dtype=np.int64), 0, nparts)]
    while stack:
        ids, first, k = stack.pop()
        if k == 1:
            parts[ids] = first
            continue
        c = coords[ids]
        axis = int(np.argmax(c.max(axis=0) - c.min(axis=0)))
        order = np.lexsort((ids, c[:, axis]))
        k_left = k // 2
        cut = int(round(len(ids) * k_left / k))
        stack.append((ids[order[:cut]], first, k_left))
        stack.append((ids[order[cut:]], first + k_left, k - k_left))
    return parts


def metis_parts(dims: tuple[int, ...], nparts: int) -> np.ndarray:
    """METIS k-way partition of the grid graph (pymetis); UsageError when pymetis is missing."""
    try:
        import pymetis
    except ImportError:
        raise UsageError("partitioner metis needs pymetis: pip install 'labkit[metis]'") from None
    n = math.prod(dims)
    if nparts == 1:
        return np.zeros(n, dtype=np.int64)
    nb = grid_neighbours(dims, np.arange(n))
    valid = nb >= 0
    xadj = np.concatenate([[0], np.cumsum(valid.sum(axis=1))]).astype(np.int64)
    adjncy = nb[valid].astype(np.int64)
    _, membership = pymetis.part_graph(nparts, adjacency=pymetis.CSRAdjacency(xadj, adjncy))
    return np.asarray(membership, dtype=np.int64)


def partition_stats(part: Partition) -> dict:
    """Edge cut, load imbalance and per-rank owned/halo counts, over all ranks.

    >>> s = partition_stats(make_partition("simple", (4, 4), 2))
    >>> s["edge_cut"], s["load_imbalance"], s["halo_values_per_rank"]
    (4, 1.0, [4, 4])
    """
    locals_ = [part.local(r) for r in range(part.nparts)]
    return summarize_locals([lp.n_owned for lp in locals_], [lp.n_halo for lp in locals_],
                            [lp.cut_edges for lp in locals_])


def summarize_locals(owned: list[int], halo: list[int], cut_edges: list[int]) -> dict:
    """The partition columns of a row from per-rank counts (each cut edge is seen by both ends).

    ``load_imbalance = max(owned) / mean(owned)`` (1.0 is perfect balance).
    """
    mean = sum(owned) / len(owned)
    return {
        "owned_rows_per_rank": [int(v) for v in owned],
        "halo_values_per_rank": [int(v) for v in halo],
        "halo_values": int(sum(halo)),
        "edge_cut": int(sum(cut_edges) // 2),
        "load_imbalance": float(max(owned) / mean),
    }
