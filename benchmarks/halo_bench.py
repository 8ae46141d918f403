"""Solve lab: the halo exchange on gloo posted two ways, side by side in one launch.

    .venv/bin/python benchmarks/halo_bench.py [--total-dof 501264] [--rounds 30] [--calls 200]

The script starts itself under torchrun on 2 ranks (``--nproc``), one thread each, on gloo
(``LABKIT_BACKEND=gloo``, whatever the machine has). Every rank builds its part of a real solve
operator (:class:`labkit.solve.operator.DistOperator`, 2-D Poisson, ``--partitioner``) and
exchanges its halo (:meth:`~labkit.solve.operator.DistOperator.exchange`: gather, post, wait)
through :class:`labkit.solve.transport.TorchTransport` both ways:

* **posted**: each irecv, then each isend, as calls of their own (gloo's form so far);
* **batch**: the same messages as one ``torch.distributed.batch_isend_irecv`` (nccl's form).

First each form's halo is checked once (every value received must be the neighbour's). Then
``--rounds`` rounds, each of them ``--calls`` exchanges of one form and then ``--calls`` of the
other (A B A B ...), every block after a barrier; a block's time per exchange is its slowest
rank's. Rank 0 prints the median per exchange of each form, their ratio and the median of the
per-round ratios: what :data:`labkit.solve.transport.GLOO_BATCHED` is chosen from.

The lab machines are shared: run it alone, and read the load average it prints before and
after.
"""

from __future__ import annotations

import argparse
import sys
import time

from _common import main_on_ranks, print_side_by_side

FORMS = ("posted", "batch")


def _rank_side(args) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist

    from labkit import runtime, timing
    from labkit.solve.config import closest_grid
    from labkit.solve.operator import DistOperator
    from labkit.solve.partition import make_partition
    from labkit.solve.problems import local_system
    from labkit.solve.transport import TorchTransport

    rt = runtime.init()
    dims = closest_grid(args.total_dof, 2)
    part = make_partition(args.partitioner, dims, rt.world_size)
    local, (indptr, cols, vals), _ = local_system(dims, part, rt.rank, "random", 0)
    op = DistOperator(local, indptr, cols, vals, world_size=rt.world_size, device=rt.device)
    comms = {"posted": TorchTransport(batched=False), "batch": TorchTransport(batched=True)}

    # the check: owned values are their global ids, so the halo must hold the halo's ids
    x = op.new_ext()
    want = torch.from_numpy(local.halo.astype(np.float64)).to(rt.device)
    for form in FORMS:
        op.comm = comms[form]
        x.zero_()
        x[: op.n_owned] = torch.from_numpy(local.owned.astype(np.float64)).to(rt.device)
        op.exchange(x)
        if not torch.equal(x[op.n_owned:], want):
            raise SystemExit(f"rank {rt.rank}: the {form} exchange delivered wrong values")

    def block(form: str, calls: int) -> float:
        op.comm = comms[form]
        dist.barrier()
        runtime.sync(rt.device)
        t0 = time.perf_counter()
        for _ in range(calls):
            op.exchange(x)
        runtime.sync(rt.device)
        return (time.perf_counter() - t0) / calls

    for form in FORMS:  # warm both: gloo's pairs, the allocator, the code paths
        block(form, max(args.calls // 10, 5))
    mine = {form: [] for form in FORMS}
    for _ in range(args.rounds):
        for form in FORMS:
            mine[form].append(block(form, args.calls))
    # a block takes as long as its slowest rank
    slowest = {form: timing.gather_samples(mine[form]).max(axis=0) for form in FORMS}
    if rt.rank == 0:
        posted, batch = slowest["posted"], slowest["batch"]
        print(f"gloo, {rt.world_size} ranks, {torch.get_num_threads()} thread(s) each; grid "
              f"{dims} ({args.partitioner}), {op.n_halo} halo values on rank 0 from "
              f"{len(local.neighbours)} neighbour(s); {args.rounds} rounds x {args.calls} "
              "exchanges per form, A B A B", flush=True)
        print_side_by_side({"posted (irecv, then isend)": posted,
                            "batch (batch_isend_irecv)": batch},
                           [b / p for p, b in zip(posted, batch)], what="per exchange", unit="us")
    runtime.finalize()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--total-dof", type=int, default=501_264)
    p.add_argument("--partitioner", default="simple", choices=("simple", "coordinate"))
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--calls", type=int, default=200, help="exchanges per form per round")
    return main_on_ranks(__file__, p, argv, _rank_side, note="shared machine: run alone",
                         env={"OMP_NUM_THREADS": "1", "LABKIT_BACKEND": "gloo"})


if __name__ == "__main__":
    sys.exit(main())
