"""Receives posted ahead: a pipeline message flows while its receiver still computes.

Rank side (imports torch.distributed). On gloo a point-to-point message is a rendezvous: the
sender announces it, and the bytes move only once the receiver has posted its receive; the
sender's transport thread then has to get a core to write them. ``torch.distributed.pipelining``'s
``ScheduleGPipe`` and ``Schedule1F1B`` post each receive right before the block that needs it,
so a message starts moving only when its receiver is already idle, waiting for it, and on a
machine whose cores are busy with the ranks' compute the transport threads wait for a core
too. (What posting ahead did on one machine: docs/measurements.md.)

:func:`post_receives_ahead` changes where the receives are posted, not the schedule: at the
start of a step, every receive of the step (the M activations from the stage before, the M
gradients from the stage after) is posted at once; the stage's own receive ops become empty,
and its forward (backward) of a microbatch first waits for that microbatch's activation
(gradient). The buffers are the stage's own per-microbatch receive buffers, so nothing more
is allocated. It needs one stage per rank and each pair of neighbouring ranks carrying one kind
of message each way (GPipe, 1F1B: :data:`labkit.pipeline.config.SCHEDULES_AHEAD`): then the
messages on a pair arrive in the order their receives were posted.
"""

from __future__ import annotations

import torch.distributed as dist

_STAGE_METHODS = ("get_fwd_recv_ops", "get_bwd_recv_ops", "forward_one_chunk",
                  "backward_one_chunk")


def post_receives_ahead(stage, n_microbatches: int) -> bool:
    """Make ``stage`` (a ``PipelineStage``) post every receive of a step as soon as the
    schedule first touches the stage in that step; False (the stage untouched) where this
    torch's stage lacks a method it uses. A step ends when its 2 M messages have been waited
    for; the next touch starts the next step."""
    if not all(callable(getattr(stage, n, None)) for n in _STAGE_METHODS):
        return False
    fwd_ops, bwd_ops = stage.get_fwd_recv_ops, stage.get_bwd_recv_ops
    forward, backward = stage.forward_one_chunk, stage.backward_one_chunk
    posted = {"F": {}, "B": {}}

    def start_step() -> None:
        if not posted["F"] and not posted["B"]:  # nothing outstanding: a step starts
            for i in range(n_microbatches):
                for kind, ops in (("F", fwd_ops(i)), ("B", bwd_ops(i))):
                    posted[kind][i] = dist.batch_isend_irecv(ops) if ops else []

    def wait(kind: str, i: int) -> None:
        start_step()
        for work in posted[kind].pop(i):
            work.wait()

    def no_recv_ops(chunk_id, *args, **kwargs):
        start_step()
        return []

    def forward_one_chunk(chunk_id, *args, **kwargs):
        wait("F", chunk_id)
        return forward(chunk_id, *args, **kwargs)

    def backward_one_chunk(chunk_id, *args, **kwargs):
        wait("B", chunk_id)
        return backward(chunk_id, *args, **kwargs)

    stage.get_fwd_recv_ops = stage.get_bwd_recv_ops = no_recv_ops
    stage.forward_one_chunk = forward_one_chunk
    stage.backward_one_chunk = backward_one_chunk
    return True
