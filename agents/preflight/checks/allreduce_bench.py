#!/usr/bin/env python3
# faultline-preflight's gang-wide NCCL all-reduce benchmark (ADR-026):
# one communicator over every GPU of every pod of the gang, started by
# torchrun on each pod. Local rank 0 of each pod prints its result in
# nccl-tests' layout (one table row and the "Avg bus bandwidth" footer),
# which faultline-preflight reads with the same parser as all_reduce_perf.
# NCCL failures propagate as PyTorch exceptions and a non-zero exit.
import os
import time

import torch
import torch.distributed as dist


def main():
    size = int(os.environ.get("PREFLIGHT_ALLREDUCE_BYTES", str(4 << 30)))
    iters = int(os.environ.get("PREFLIGHT_ALLREDUCE_ITERS", "20"))
    warmup = int(os.environ.get("PREFLIGHT_ALLREDUCE_WARMUP", "5"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl")
    world = dist.get_world_size()
    count = size // 4
    tensor = torch.randn(count, dtype=torch.float32, device=f"cuda:{local_rank}")
    for _ in range(warmup):
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    torch.cuda.synchronize()
    elapsed = (time.perf_counter() - start) / iters
    algbw = size / elapsed / 1e9
    busbw = algbw * (2 * (world - 1) / world)
    if local_rank == 0:
        print("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong", flush=True)
        print(f"{size:12d}  {count:12d}  {'float':>8s}  {'sum':>6s}  {-1:6d}  {elapsed * 1e6:7.1f}  {algbw:6.2f}  {busbw:6.2f}  {'N/A':>6s}  {elapsed * 1e6:7.1f}  {algbw:6.2f}  {busbw:6.2f}  {'N/A':>6s}", flush=True)
        print(f"# Avg bus bandwidth    : {busbw:g}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
