#!/usr/bin/env python3
"""DistributedDataParallel training benchmark over NCCL, one process per GPU.

    torchrun --standalone --nproc_per_node=2 scripts/bench_ddp.py --steps 30
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=$PWD/target/release/libsomashim.so \\
        torchrun --standalone --nproc_per_node=2 scripts/bench_ddp.py --steps 30

The allocator comes from the caller's environment (as in bench_torch.py). Model: a
4-layer nn.TransformerEncoder (d_model 512, nhead 8), batch 16 per rank, sequence
length random in 64..512 per step (seeded; the same length on every rank, different
data per rank), fp32, AdamW. A step = forward + backward (gradients all-reduced by
DDP) + optimizer step; timed with torch.cuda.synchronize() + time.perf_counter().

Rank 0 prints one JSON line: ms_per_step_median (rank 0's), ms_per_step_median_max
(the slowest rank's median), host_ms_per_step_median (rank 0's: the part of a step
until its thread had issued the optimizer step, before it synchronizes; close to the
step's time, the step waits for the host), peak_device_used_mib (rank 0:
cudaMemGetInfo total - free after each step, peak minus the value before the model),
final_loss, and the checks:
  loss_finite       every rank's loss stayed finite
  params_identical  after training, every rank's parameters equal rank 0's, bit for
                    bit (rank 0 broadcasts its flattened parameters, each rank
                    compares with torch.equal, all-reduce MIN of the verdicts)
On an error a rank prints a JSON line with "error" and exits 1 (with a timeout on
the process group, so a lost peer does not hang forever).
--device cpu uses gloo on the CPU with tiny shapes, to check the script without GPUs.
"""
import argparse
import datetime
import json
import math
import os
import random
import statistics
import sys
import time
import traceback

MIB = 1024.0 * 1024.0


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=30, help="timed steps after the warm-up (default 30)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (default 5)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--label", default="", help="scenario name copied into the JSON line")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: gloo, tiny shapes (a check)")
    p.add_argument("--timeout", type=int, default=120, help="process-group timeout, seconds (default 120)")
    return p.parse_args(argv)


def allocator_from_env():
    if os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING", "") not in ("", "0"):
        return "caching-off"
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") + "," + os.environ.get("PYTORCH_ALLOC_CONF", "")
    if "cudamallocasync" in conf.replace(" ", "").lower():
        return "cudaMallocAsync"
    return "caching"


def run(args, result, rank, world, local_rank):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    result["torch"] = torch.__version__
    cuda = args.device == "cuda"
    if cuda:
        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False")
        if torch.cuda.device_count() <= local_rank:
            raise RuntimeError(f"local rank {local_rank} but only {torch.cuda.device_count()} GPU(s)")
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
        torch.zeros(1, device=dev)
        torch.cuda.synchronize(dev)
        result["gpu"] = torch.cuda.get_device_name(dev)
        result["cuda_runtime"] = torch.version.cuda
        try:
            v = torch.cuda.nccl.version()
            result["nccl"] = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
        except Exception:
            result["nccl"] = None
    else:
        dev = torch.device("cpu")

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    def used_bytes():
        if not cuda:
            return 0
        free, total = torch.cuda.mem_get_info(dev)
        return total - free

    backend = "nccl" if cuda else "gloo"
    kwargs = {"backend": backend, "timeout": datetime.timedelta(seconds=args.timeout)}
    if cuda:
        kwargs["device_id"] = dev
    try:
        dist.init_process_group(**kwargs)
    except TypeError:  # a torch without device_id
        kwargs.pop("device_id", None)
        dist.init_process_group(**kwargs)
    result["backend"] = backend
    if dist.get_world_size() != world:
        raise RuntimeError(f"world size {dist.get_world_size()} != WORLD_SIZE {world}")

    baseline = used_bytes()
    d_model, nhead, layers, batch, lengths = (512, 8, 4, 16, (64, 512)) if cuda else (32, 4, 2, 2, (4, 16))
    torch.manual_seed(args.seed)  # the same initial weights on every rank (DDP also broadcasts them)
    layer = torch.nn.TransformerEncoderLayer(d_model=d_model, nhead=nhead, dim_feedforward=4 * d_model,
                                             batch_first=True, dropout=0.0)
    model = torch.nn.TransformerEncoder(layer, num_layers=layers, enable_nested_tensor=False).to(dev)
    ddp = DDP(model, device_ids=[local_rank] if cuda else None)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    loss_fn = torch.nn.MSELoss()
    torch.manual_seed(args.seed + 1000 * (rank + 1))  # different data per rank
    shapes = random.Random(args.seed)  # the same lengths on every rank
    peak_used = baseline
    times_ms = []
    host_ms = []
    loss_value = None
    finite = True
    total = args.warmup + args.steps
    for step in range(total):
        length = shapes.randint(*lengths)
        x = torch.randn(batch, length, d_model, device=dev)
        y = torch.randn(batch, length, d_model, device=dev)
        sync()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(x), y)
        loss.backward()
        opt.step()
        issued = time.perf_counter()
        sync()
        dt = (time.perf_counter() - t0) * 1e3
        peak_used = max(peak_used, used_bytes())
        loss_value = float(loss.detach())
        finite = finite and math.isfinite(loss_value)
        if step >= args.warmup:
            times_ms.append(dt)
            host_ms.append((issued - t0) * 1e3)
        if rank == 0 and (step == 0 or (step + 1) % 10 == 0 or step + 1 == total):
            print(f"[bench_ddp] step {step + 1}/{total}{' (warm-up)' if step < args.warmup else ''}: "
                  f"seq {length}, {dt:.2f} ms, loss {loss_value:.4f}", file=sys.stderr, flush=True)
        del x, y, loss

    if not times_ms:
        raise RuntimeError("no timed steps (--steps 0)")
    median = statistics.median(times_ms)

    # Checks, gathered on every rank.
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    ref = flat.clone()
    dist.broadcast(ref, src=0)
    verdict = torch.tensor([1.0 if torch.equal(flat, ref) else 0.0, 1.0 if finite else 0.0], device=dev)
    dist.all_reduce(verdict, op=dist.ReduceOp.MIN)
    slowest = torch.tensor([median], dtype=torch.float64, device=dev)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    sync()

    result["ms_per_step_median"] = round(median, 3)
    result["ms_per_step_median_max"] = round(float(slowest.item()), 3)
    result["ms_per_step_mean"] = round(statistics.fmean(times_ms), 3)
    result["host_ms_per_step_median"] = round(statistics.median(host_ms), 3)
    result["peak_device_used_mib"] = round((peak_used - baseline) / MIB, 1) if cuda else None
    result["params_m"] = round(flat.numel() / 1e6, 2)
    result["param_checksum"] = float(flat.double().sum().item())
    result["final_loss"] = round(loss_value, 6)
    result["params_identical"] = bool(verdict[0].item() == 1.0)
    result["loss_finite"] = bool(verdict[1].item() == 1.0)
    result["check_ok"] = result["params_identical"] and result["loss_finite"]
    dist.barrier()
    dist.destroy_process_group()


def main(argv=None):
    args = parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    result = {
        "bench": "ddp",
        "scenario": args.label or None,
        "model": "transformer-ddp",
        "allocator": allocator_from_env(),
        "shim": "somashim" in os.environ.get("LD_PRELOAD", ""),
        "world_size": world,
        "steps": args.steps,
        "warmup": args.warmup,
        "device": args.device,
    }
    t0 = time.perf_counter()
    rc = 0
    try:
        run(args, result, rank, world, local_rank)
        if not result.get("check_ok"):
            rc = 1
    except Exception as e:
        traceback.print_exc(file=sys.stderr)
        result["error"] = f"rank {rank}: {type(e).__name__}: {e}"[:500]
        result["check_ok"] = False
        rc = 1
    result["wall_s"] = round(time.perf_counter() - t0, 2)
    if rank == 0 or "error" in result:
        print(json.dumps(result), flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
