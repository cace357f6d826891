#!/usr/bin/env python3
"""One PyTorch training benchmark, run under whatever allocator the environment picks.

    python3 scripts/bench_torch.py --model transformer --steps 30 --warmup 5
    python3 scripts/bench_torch.py --model resnet --steps 30 --warmup 5

Models (shapes change from step to step, seeded, so the allocator sees varying sizes):
  transformer  nn.TransformerEncoder, 6 layers, d_model 512, nhead 8, batch 32,
               sequence length random in 64..512 per step, fp32, AdamW.
  resnet       torchvision resnet50 (random init, no download), batch size random
               from {16,32,48,64} per step, 224x224 random inputs, 1000 classes, SGD.

The allocator is chosen by the caller's environment, and reported:
  caching          PyTorch's default caching allocator
  caching-off      PYTORCH_NO_CUDA_MEMORY_CACHING=1 (every tensor a cudaMalloc/cudaFree)
  cudaMallocAsync  PYTORCH_CUDA_ALLOC_CONF (or PYTORCH_ALLOC_CONF) has backend:cudaMallocAsync
and "shim": true when LD_PRELOAD names libsomashim.

A step = forward + backward + optimizer step (the inputs are made just before it).
Time: torch.cuda.synchronize() and time.perf_counter() around each step; the
median over the steps after the warm-up. host_ms_per_step_median: the part of
it until the program's thread has issued the step (before the closing
synchronize); close to the step's time, the step waits for the host. Memory, in MiB:
  peak_reserved_mib     torch.cuda.max_memory_reserved(): what PyTorch's own allocator
                        holds; null with caching off, where PyTorch keeps no figures.
  peak_device_used_mib  device memory in use (cudaMemGetInfo total - free), the peak
                        over probes taken after the forward pass, after backward and
                        after the (synchronized) optimizer step of every step, minus
                        the value measured before the model was created (after the
                        CUDA context exists). Comparable across every allocator,
                        the shim's pool included. A transient peak inside backward
                        can be missed by the size of a few temporaries.
The probes are host calls that do not synchronize; their cost (mem_probe_us) is
measured and reported. --no-mid-probes keeps only the after-step probe.

Output: one JSON line on stdout (progress goes to stderr). On an error the JSON
line has "error" and the exit status is 1. --smoke shrinks every shape so that the
script can be checked on a CPU (--device cpu) in seconds.
"""
import argparse
import json
import math
import os
import random
import statistics
import sys
import time
import traceback

MIB = 1024.0 * 1024.0


def log(msg):
    print(f"[bench_torch] {msg}", file=sys.stderr, flush=True)


def allocator_from_env():
    if os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING", "") not in ("", "0"):
        return "caching-off"
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") + "," + os.environ.get("PYTORCH_ALLOC_CONF", "")
    if "cudamallocasync" in conf.replace(" ", "").lower():
        return "cudaMallocAsync"
    return "caching"


def shim_preloaded():
    return "somashim" in os.environ.get("LD_PRELOAD", "")


def loaded_cudart():
    """The libcudart.so this process mapped, or None (a statically linked runtime, as CuPy's
    wheels have, is reached by the shim only through its driver entry points)."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                if "libcudart.so" in line:
                    return line.split()[-1]
    except OSError:
        pass
    return None


def device_probes(torch, dev):
    """sync(): waits for the device (nothing on a CPU); used(): device memory in
    use, cudaMemGetInfo's total - free (None on a CPU)."""
    cuda = dev.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    def used():
        if not cuda:
            return None
        free, total = torch.cuda.mem_get_info(dev)
        return total - free

    return sync, used


class Probes:
    """A device opened for a benchmark, its context made: `sync()` waits for
    it, `used()` is its memory in use (0 on a CPU), `probe()` keeps the most
    `used()` has read since the start (`baseline`) in `peak`."""

    def __init__(self, torch, name, result):
        self.torch = torch
        self.dev = torch.device(name)
        self.cuda = self.dev.type == "cuda"
        if self.cuda and not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False (no GPU, or a CPU-only torch)")
        if self.cuda and self.dev.index is None:  # mem_get_info wants an index
            self.dev = torch.device("cuda", torch.cuda.current_device())
        self.sync, self._used = device_probes(torch, self.dev)
        if self.cuda:
            torch.zeros(1, device=self.dev)
            self.sync()
            result["gpu"] = torch.cuda.get_device_name(self.dev)
        self.baseline = self.used()
        self.peak = self.baseline

    def used(self):
        return self._used() or 0

    def probe(self):
        self.peak = max(self.peak, self.used())

    def report(self, result):
        """The peak in use beyond the start, and what the caching allocator reserved."""
        result["libcudart"] = loaded_cudart()
        result["peak_device_used_mib"] = round((self.peak - self.baseline) / MIB, 1) if self.cuda else None
        if self.cuda and result["allocator"] != "caching-off":
            result["peak_reserved_mib"] = round(self.torch.cuda.max_memory_reserved(self.dev) / MIB, 1)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=["transformer", "resnet"], required=True)
    p.add_argument("--steps", type=int, default=30, help="timed steps after the warm-up (default 30)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (default 5)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu for a smoke test")
    p.add_argument("--label", default="", help="scenario name copied into the JSON line")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, to check the script itself (CPU)")
    p.add_argument("--no-mid-probes", action="store_true",
                   help="probe device memory only after each step, not after forward/backward")
    return p.parse_args(argv)


class Transformer:
    """Encoder stack on random embeddings; loss = MSE against a random target."""

    def __init__(self, torch, device, smoke):
        nn = torch.nn
        self.torch = torch
        self.device = device
        self.d_model, nhead, layers = (64, 4, 2) if smoke else (512, 8, 6)
        self.batch = 4 if smoke else 32
        self.lengths = (8, 32) if smoke else (64, 512)
        layer = nn.TransformerEncoderLayer(d_model=self.d_model, nhead=nhead,
                                           dim_feedforward=4 * self.d_model, batch_first=True)
        self.model = nn.TransformerEncoder(layer, num_layers=layers, enable_nested_tensor=False).to(device)
        self.model.train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.loss_fn = nn.MSELoss()

    def shape(self, rng):
        return rng.randint(self.lengths[0], self.lengths[1])

    def inputs(self, length):
        t = self.torch
        x = t.randn(self.batch, length, self.d_model, device=self.device)
        y = t.randn(self.batch, length, self.d_model, device=self.device)
        return x, y

    def describe(self, length):
        return f"seq {length}"


class ResNet:
    """torchvision resnet50, random weights; cross-entropy on random labels."""

    def __init__(self, torch, device, smoke):
        import torchvision

        self.torch = torch
        self.device = device
        self.classes = 10 if smoke else 1000
        self.image = 32 if smoke else 224
        self.batches = (2, 4) if smoke else (16, 32, 48, 64)
        ctor = torchvision.models.resnet18 if smoke else torchvision.models.resnet50
        self.model = ctor(weights=None, num_classes=self.classes).to(device)
        self.model.train()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.loss_fn = torch.nn.CrossEntropyLoss()

    def shape(self, rng):
        return rng.choice(self.batches)

    def inputs(self, batch):
        t = self.torch
        x = t.randn(batch, 3, self.image, self.image, device=self.device)
        y = t.randint(0, self.classes, (batch,), device=self.device)
        return x, y

    def describe(self, batch):
        return f"batch {batch}"


def run(args, result):
    import torch

    result["torch"] = torch.__version__
    result["cuda_runtime"] = torch.version.cuda
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    if cuda and not torch.cuda.is_available():
        raise RuntimeError("torch.cuda.is_available() is False (no GPU, or a CPU-only torch)")

    if cuda:
        torch.cuda.init()
        if dev.index is None:  # set_device and friends want an index
            dev = torch.device("cuda", torch.cuda.current_device())
    sync, used_bytes = device_probes(torch, dev)
    if cuda:
        torch.cuda.set_device(dev)
        torch.zeros(1, device=dev)  # create the context before the baseline
        sync()
        result["gpu"] = torch.cuda.get_device_name(dev)
        try:
            result["allocator_backend"] = torch.cuda.get_allocator_backend()
        except Exception:  # older torch
            result["allocator_backend"] = None
        n = 200
        t0 = time.perf_counter()
        for _ in range(n):
            used_bytes()
        result["mem_probe_us"] = round((time.perf_counter() - t0) / n * 1e6, 2)
    baseline = used_bytes()
    result["baseline_device_used_mib"] = round(baseline / MIB, 1) if baseline is not None else None

    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    log(f"building {args.model} on {dev}{' (smoke shapes)' if args.smoke else ''}")
    bench = Transformer(torch, dev, args.smoke) if args.model == "transformer" else ResNet(torch, dev, args.smoke)
    model, opt, loss_fn = bench.model, bench.opt, bench.loss_fn
    result["params_m"] = round(sum(p.numel() for p in model.parameters()) / 1e6, 2)

    peak_used = baseline
    mid = cuda and not args.no_mid_probes
    times_ms = []
    host_ms = []
    loss_value = None
    total = args.warmup + args.steps
    for step in range(total):
        shape = bench.shape(rng)
        x, y = bench.inputs(shape)
        sync()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        out = model(x)
        loss = loss_fn(out, y)
        if mid:
            peak_used = max(peak_used, used_bytes())
        loss.backward()
        if mid:
            peak_used = max(peak_used, used_bytes())
        opt.step()
        issued = time.perf_counter()
        sync()
        dt = (time.perf_counter() - t0) * 1e3
        if cuda:
            peak_used = max(peak_used, used_bytes())
        loss_value = float(loss.detach())
        if not math.isfinite(loss_value):
            raise RuntimeError(f"loss is not finite at step {step}: {loss_value}")
        warm = step < args.warmup
        if not warm:
            times_ms.append(dt)
            host_ms.append((issued - t0) * 1e3)
        if step == 0 or (step + 1) % 10 == 0 or step + 1 == total:
            log(f"step {step + 1}/{total}{' (warm-up)' if warm else ''}: {bench.describe(shape)}, "
                f"{dt:.2f} ms, loss {loss_value:.4f}")
        del x, y, out, loss

    if not times_ms:
        raise RuntimeError("no timed steps (--steps 0)")
    result["ms_per_step_median"] = round(statistics.median(times_ms), 3)
    result["ms_per_step_mean"] = round(statistics.fmean(times_ms), 3)
    result["ms_per_step_min"] = round(min(times_ms), 3)
    result["ms_per_step_max"] = round(max(times_ms), 3)
    result["host_ms_per_step_median"] = round(statistics.median(host_ms), 3)
    result["final_loss"] = round(loss_value, 6)
    result["loss_finite"] = True
    result["libcudart"] = loaded_cudart()
    if cuda:
        caching = result["allocator"] != "caching-off"

        def torch_figure(fn):
            try:
                return round(fn(dev) / MIB, 1) if caching else None
            except Exception as e:  # a backend without the figure
                log(f"{fn.__name__}: {e}")
                return None

        result["peak_reserved_mib"] = torch_figure(torch.cuda.max_memory_reserved)
        result["peak_allocated_mib"] = torch_figure(torch.cuda.max_memory_allocated)
        result["peak_device_used_mib"] = round((peak_used - baseline) / MIB, 1)
    else:
        result["peak_reserved_mib"] = None
        result["peak_allocated_mib"] = None
        result["peak_device_used_mib"] = None


def run_and_report(run, args, result):
    """run(args, result), then `result` as one JSON line on stdout, with the
    error if it failed (every failure reported so, never a silent death) and
    the wall time; the exit status."""
    t0 = time.perf_counter()
    rc = 0
    try:
        run(args, result)
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt):
            raise
        traceback.print_exc(file=sys.stderr)
        result["error"] = f"{type(e).__name__}: {e}"[:500]
        rc = 1
    result["wall_s"] = round(time.perf_counter() - t0, 2)
    print(json.dumps(result), flush=True)
    return rc


def main(argv=None):
    args = parse_args(argv)
    result = {
        "bench": "torch",
        "scenario": args.label or None,
        "model": args.model,
        "allocator": allocator_from_env(),
        "shim": shim_preloaded(),
        "steps": args.steps,
        "warmup": args.warmup,
        "seed": args.seed,
        "device": args.device,
        "smoke": args.smoke,
    }
    rc = run_and_report(run, args, result)
    if rc == 0:
        log(f"{args.model} [{result['allocator']}{', shim' if result['shim'] else ''}]: "
            f"{result['ms_per_step_median']} ms/step, final loss {result['final_loss']}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
