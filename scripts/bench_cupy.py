#!/usr/bin/env python3
"""CuPy array-op chains, with CuPy's memory pool on or off.

    python3 scripts/bench_cupy.py --mode pool     # CuPy's default memory pool
    python3 scripts/bench_cupy.py --mode nopool   # cupy.cuda.set_allocator(None): every
                                                  # array a cudaMalloc, every free a cudaFree
    LD_PRELOAD=target/release/libsomashim.so python3 scripts/bench_cupy.py --mode nopool

One chain = --ops operations, each on a fresh array of a random size between 1 KiB
and 32 MiB (log-uniform, float32, seeded, the same sequence in every mode):
    x = random(n); y = x * 2 + 1; z = sqrt(abs(y)); acc += z.sum()
with the last --live arrays z kept alive (so several blocks are live at once), and
the chain ends by reading acc on the host. Each op allocates about six arrays
(temporaries and the reduction's scratch included).

Time: device synchronize + time.perf_counter() around each chain; the median over
the chains after the warm-up. Memory: peak_device_used_mib = peak of
cudaMemGetInfo (total - free) probed after every op and after every chain, minus
the value before the first chain (context created). In pool mode also
pool_total_mib_peak (cupy.get_default_memory_pool().total_bytes()).
Check: x is uniform in [0,1), so the mean of sqrt(2x+1) is (3^1.5 - 1)/3 = 1.39871;
every chain's mean must be within 0.02 of it ("check_ok"). "checksum" (the sum over
chains) is the same in every mode for the same seed, up to float rounding.

Output: one JSON line on stdout (progress to stderr); on an error the line has
"error" and the exit status is 1. --xp numpy runs the same chains on the CPU with
NumPy, to check the script itself without a GPU.
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
EXPECTED_MEAN = (3.0 ** 1.5 - 1.0) / 3.0


def log(msg):
    print(f"[bench_cupy] {msg}", file=sys.stderr, flush=True)


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


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", choices=["pool", "nopool"], required=True)
    p.add_argument("--chains", type=int, default=40, help="timed chains after the warm-up (default 40)")
    p.add_argument("--warmup", type=int, default=5, help="untimed chains first (default 5)")
    p.add_argument("--ops", type=int, default=16, help="operations per chain (default 16)")
    p.add_argument("--live", type=int, default=4, help="results kept alive at once (default 4)")
    p.add_argument("--min-bytes", type=int, default=1024)
    p.add_argument("--max-bytes", type=int, default=32 * 1024 * 1024)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--label", default="", help="scenario name copied into the JSON line")
    p.add_argument("--xp", choices=["cupy", "numpy"], default="cupy", help="numpy: CPU check of the script")
    return p.parse_args(argv)


def sizes_for(args, rng):
    lo, hi = math.log(args.min_bytes), math.log(args.max_bytes)
    return [max(1, int(math.exp(rng.uniform(lo, hi))) // 4) for _ in range(args.ops)]


def run(args, result):
    if args.xp == "cupy":
        import cupy as xp

        if args.mode == "nopool":
            xp.cuda.set_allocator(None)  # before any allocation
        result["cupy"] = xp.__version__
        rt = xp.cuda.runtime
        result["cuda_runtime"] = rt.runtimeGetVersion()
        result["cuda_driver"] = rt.driverGetVersion()
        dev_id = xp.cuda.Device().id
        name = rt.getDeviceProperties(dev_id)["name"]
        result["gpu"] = name.decode() if isinstance(name, bytes) else str(name)
        xp.random.seed(args.seed)

        def random_array(n):
            return xp.random.random_sample(n, dtype=xp.float32)

        def sync():
            rt.deviceSynchronize()

        def used_bytes():
            free, total = rt.memGetInfo()
            return total - free

        pool = xp.get_default_memory_pool() if args.mode == "pool" else None
    else:
        import numpy as xp

        result["numpy"] = xp.__version__
        gen = xp.random.default_rng(args.seed)

        def random_array(n):
            return gen.random(n, dtype=xp.float32)

        def sync():
            pass

        def used_bytes():
            return 0

        pool = None

    rng = random.Random(args.seed)
    sync()
    baseline = used_bytes()
    result["baseline_device_used_mib"] = round(baseline / MIB, 1)
    peak_used = baseline
    peak_pool = 0
    times_ms = []
    checksum = 0.0
    worst = 0.0
    total = args.warmup + args.chains
    for chain in range(total):
        sizes = sizes_for(args, rng)
        sync()
        t0 = time.perf_counter()
        live = []
        acc = xp.zeros((), dtype=xp.float64)
        elements = 0
        for n in sizes:
            x = random_array(n)
            y = x * 2 + 1
            z = xp.sqrt(xp.abs(y))
            acc = acc + z.sum(dtype=xp.float64)
            elements += n
            live.append(z)
            if len(live) > args.live:
                live.pop(0)
            del x, y, z
            peak_used = max(peak_used, used_bytes())
        value = float(acc)  # reads the result on the host
        del live, acc
        sync()
        dt = (time.perf_counter() - t0) * 1e3
        peak_used = max(peak_used, used_bytes())
        if pool is not None:
            peak_pool = max(peak_pool, pool.total_bytes())
        mean = value / elements
        worst = max(worst, abs(mean - EXPECTED_MEAN))
        if not math.isfinite(value) or abs(mean - EXPECTED_MEAN) > 0.02:
            raise RuntimeError(f"chain {chain}: mean {mean} differs from {EXPECTED_MEAN:.5f}: wrong results")
        checksum += value
        warm = chain < args.warmup
        if not warm:
            times_ms.append(dt)
        if chain == 0 or (chain + 1) % 10 == 0 or chain + 1 == total:
            log(f"chain {chain + 1}/{total}{' (warm-up)' if warm else ''}: {sum(sizes) * 4 / MIB:.1f} MiB "
                f"in {len(sizes)} arrays, {dt:.2f} ms")

    if not times_ms:
        raise RuntimeError("no timed chains (--chains 0)")
    result["ms_per_chain_median"] = round(statistics.median(times_ms), 3)
    result["ms_per_chain_mean"] = round(statistics.fmean(times_ms), 3)
    result["ms_per_chain_min"] = round(min(times_ms), 3)
    result["ms_per_chain_max"] = round(max(times_ms), 3)
    result["peak_device_used_mib"] = round((peak_used - baseline) / MIB, 1) if args.xp == "cupy" else None
    result["pool_total_mib_peak"] = round(peak_pool / MIB, 1) if pool is not None else None
    result["checksum"] = checksum
    result["max_mean_error"] = round(worst, 6)
    result["check_ok"] = True
    result["libcudart"] = loaded_cudart()


def main(argv=None):
    args = parse_args(argv)
    result = {
        "bench": "cupy",
        "scenario": args.label or None,
        "mode": args.mode,
        "shim": "somashim" in os.environ.get("LD_PRELOAD", ""),
        "chains": args.chains,
        "warmup": args.warmup,
        "ops": args.ops,
        "live": args.live,
        "seed": args.seed,
        "xp": args.xp,
    }
    t0 = time.perf_counter()
    rc = 0
    try:
        run(args, result)
    except Exception as e:  # report every failure as a JSON line
        traceback.print_exc(file=sys.stderr)
        result["error"] = f"{type(e).__name__}: {e}"[:500]
        result["check_ok"] = False
        rc = 1
    result["wall_s"] = round(time.perf_counter() - t0, 2)
    print(json.dumps(result), flush=True)
    if rc == 0:
        log(f"{args.mode}{' + shim' if result['shim'] else ''}: {result['ms_per_chain_median']} ms/chain")
    return rc


if __name__ == "__main__":
    sys.exit(main())
