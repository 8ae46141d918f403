"""The baseline of collectives_bench.py: a plain loop of dist.all_reduce, nothing of labkit.

torchrun --standalone --nproc-per-node=2 benchmarks/_raw_allreduce.py SIZES_CSV ITERS WARMUP
Prints one JSON line on rank 0: {size_bytes: [median over calls of the slowest rank's call time,
loop time / iters of the slowest rank]} (seconds).
"""

import json
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
sizes = [int(s) for s in sys.argv[1].split(",")]
iters, warmup = int(sys.argv[2]), int(sys.argv[3])
out = {}
for size in sizes:
    buf = torch.zeros(size // 4, dtype=torch.float32)
    for _ in range(warmup):
        dist.all_reduce(buf)
    dist.barrier()
    stamps = [time.perf_counter()]
    for _ in range(iters):
        dist.all_reduce(buf)
        stamps.append(time.perf_counter())
    per_call = torch.tensor(stamps, dtype=torch.float64).diff()
    loop = torch.tensor([(stamps[-1] - stamps[0]) / iters], dtype=torch.float64)
    dist.all_reduce(per_call, op=dist.ReduceOp.MAX)
    dist.all_reduce(loop, op=dist.ReduceOp.MAX)
    out[size] = [per_call.median().item(), loop.item()]
if dist.get_rank() == 0:
    print(json.dumps(out), flush=True)
dist.destroy_process_group()
