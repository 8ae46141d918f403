"""Small configs of every worker (:data:`labkit.launch.WORKERS`), shared by the device audit's
launches (tests/test_audit.py) and the GPU tests (tests/test_gpu.py): each launch a few
seconds, yet every code path that hands tensors to torch.distributed runs at least once."""

from __future__ import annotations

import math

#: the workers that need two ranks or more (a pipeline of one stage, a ring of one rank)
MIN_RANKS = {"pipeline": 2, "transport": 2, "machine": 2}


def config(worker: str, world_size: int) -> dict:
    """The small config of ``worker`` for ``world_size`` ranks (heads, widths and layers grow
    with it where the lab splits them over the ranks)."""
    heads = math.lcm(4, world_size)  # tp splits whole heads, fsdp every tensor's first dim
    model = {"hidden": 8 * heads, "num_heads": heads, "seq_len": 8, "batch_size": 2,
             "num_layers": 2, "steps": 3, "warmup": 1}
    micro = max(2, world_size)
    return {
        "solve": {"modes": ["strong"], "total_dof": 400, "methods": ["cg", "pipecg"],
                  "partitioners": ["simple"], "warmup": 0, "repeat": 1, "transport": "torch"},
        "collectives": {"ops": ["all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                "all_to_all"],
                        "min_bytes": 64, "max_bytes": 1024, "factor": 16, "iters": 2,
                        "warmup": 1},
        # 1F1B keeps a microbatch in flight on every stage: M >= P
        "pipeline": {"schedules": ["naive_gpipe", "gpipe", "1f1b"], "microbatches": [micro],
                     "layers": max(4, world_size), "hidden": 16, "batch": 4 * micro, "steps": 1,
                     "warmup": 1, "compare_placement_at": []},
        "ddp": {"model": "mlp", "input_dim": 16, "hidden_dim": 32, "output_dim": 5,
                "num_layers": 2, "batch_size": 8, "steps": 4, "warmup": 1},
        "tp": model,
        # E/P whole experts on each rank
        "moe": {"num_experts": math.lcm(4, world_size), "top_k": 2, "hidden": 16, "tokens": 16,
                "steps": 3, "warmup": 1},
        "fsdp": model,
        # 2P chunks of 4 tokens: the balanced causal split
        "cp": {"seq_len": 8 * world_size, "hidden": 16, "num_heads": 2, "batch_size": 2,
               "steps": 2, "warmup": 1},
        "workshare": {"total_work": 8, "serial_fraction": 0.25, "matrix_size": 16, "warmup": 0,
                      "repeat": 1},
        "placement": {"allreduce_bytes": 4096, "warmup": 1, "repeat": 2},
        # the torch transport only: shared memory is for ranks on one CPU host, never a GPU's
        "transport": {"transports": ["torch"], "rounds": 5, "values": 16, "jitter_us": 0.0,
                      "repeat": 5},
        "selftest": {},
        "machine": {"matmul_sizes": [8, 16], "step_width": 16, "step_batches": [4],
                    "copy_bytes": 4096, "min_bytes": 8, "max_bytes": 512, "iters": 2,
                    "warmup": 1, "sample_s": 0.001, "busy_n": 16},
    }[worker]
