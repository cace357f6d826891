#!/usr/bin/env python3
"""The compatibility matrix (`make compat`): every GPU framework and library
installed here, each in a small program of this project's own
(scripts/compat/), run natively and under the shim; where the row names the
framework's own allocator, that run too. A row passes when both runs exit 0
and print the same RESULT (seeded programs; floats rounded to the digits
each program names). Prints one table and writes it, with the command,
versions and machine, to OUT/COMPATIBILITY.md.

    scripts/compat.py path/to/libsomashim.so [--only REGEX] [--rounds N] [--out DIR]

Times are each run's median step. With --rounds N the row's runs take turns N
times (native, shim, own allocator, native again), and each ratio is the
median of the rounds' ratios with its interval (scripts/ratios.py); the
second native run gives the noise floor, and a `ratio:` line a row says whether
its interval resolves 5%. Every run is pinned to the CPUs of GPU 0's NUMA node
(scripts/gpu_cpus.sh; BENCH_PIN=0: not pinned). Exit status 1 if a
row differs or fails, 0 otherwise (rows whose framework is not installed are
listed as skipped).
"""
import argparse
import datetime
import hashlib
import importlib.metadata
import json
import os
import re
import shlex
import signal
import subprocess
import sys

import ratios

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMPAT = os.path.join(ROOT, "scripts", "compat")
NO_CACHING = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
# Keep NVLink multicast off wherever NCCL runs: it can take shared GPUs out of service.
NCCL_SAFE = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


class Row:
    """name; program (argv after the interpreter); env of both runs; the module it
    needs; own: (program, env) of the run with the framework's own allocator."""

    def __init__(self, name, program, env=None, needs="torch", own=None):
        self.name, self.program, self.env, self.needs, self.own = name, program, env or {}, needs, own


def torch_row(name, what, env=None, own_env=None):
    program = ["torch_rows.py", what]
    return Row(name, program, env, "transformers" if what == "generate" else "torch",
               None if own_env is None else (program, own_env))


ROWS = [
    torch_row("PyTorch eager training, caching allocator", "train"),
    torch_row("PyTorch eager training, caching off", "train", NO_CACHING, own_env={}),
    torch_row("PyTorch expandable_segments:True", "train", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
    torch_row("PyTorch backend:cudaMallocAsync", "train", {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}),
    torch_row("transformers GPT-2 generation, caching allocator", "generate"),
    torch_row("transformers GPT-2 generation, caching off", "generate", NO_CACHING, own_env={}),
    torch_row("torch.compile (Inductor), caching off", "compile", NO_CACHING, own_env={}),
    torch_row("torch.cuda.graphs, caching allocator", "graphs"),
    # With its caching allocator off, PyTorch does not share CUDA tensors at all
    # (`make gpu-test`'s torch_ipc@caching_off checks that the shim changes nothing there).
    torch_row("torch.multiprocessing CUDA tensor, caching allocator", "ipc"),
    torch_row("NCCL all-reduce (torch.distributed), caching off", "nccl", {**NO_CACHING, **NCCL_SAFE}),
    Row("JAX, BFC allocator (default)", ["jax_rows.py", "train"], needs="jax"),
    # XLA's platform allocator cannot free asynchronously, so XLA waits for the device after
    # every execution, under the shim too: the fair own allocator is XLA's cudaMallocAsync one.
    Row("JAX, XLA_PYTHON_CLIENT_ALLOCATOR=platform", ["jax_rows.py", "train"],
        {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}, "jax",
        own=(["jax_rows.py", "train"], {"XLA_PYTHON_CLIENT_ALLOCATOR": "cuda_async"})),
    Row("JAX, XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async", ["jax_rows.py", "train"],
        {"XLA_PYTHON_CLIENT_ALLOCATOR": "cuda_async"}, "jax", own=(["jax_rows.py", "train"], {})),
    Row("JAX, XLA_PYTHON_CLIENT_PREALLOCATE=false", ["jax_rows.py", "train"],
        {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}, "jax", own=(["jax_rows.py", "train"], {})),
    Row("CuPy, its pool", ["cupy_rows.py", "chain", "on"], needs="cupy"),
    Row("CuPy, pool off", ["cupy_rows.py", "chain", "off"], needs="cupy", own=(["cupy_rows.py", "chain", "on"], {})),
    Row("CuPy, MemoryAsyncPool", ["cupy_rows.py", "chain", "async"], needs="cupy",
        own=(["cupy_rows.py", "chain", "on"], {})),
    Row("CuPy cuBLAS/cuFFT/cuSOLVER/cuRAND/cuSPARSE, its pool", ["cupy_rows.py", "libs", "on"], needs="cupy"),
    Row("CuPy cuBLAS/cuFFT/cuSOLVER/cuRAND/cuSPARSE, pool off", ["cupy_rows.py", "libs", "off"], needs="cupy",
        own=(["cupy_rows.py", "libs", "on"], {})),
    Row("C program under compute-sanitizer memcheck", ["sanitizer"], needs="compute-sanitizer"),
]


def run(argv, env, timeout=240):
    """(exit status, stdout, stderr) of one run. A run past `timeout` is
    killed with every process it started (spawned workers hold the GPU)."""
    p = subprocess.Popen(argv, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         cwd=ROOT, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
        return p.returncode, out, err
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return 124, out, err + f"\ntimed out after {timeout} s"


def result_of(stdout):
    for line in reversed(stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return None


class Sanitized:
    """The C row: the demo's legacy loop under compute-sanitizer memcheck; the
    shim is preloaded into the target only. Its result is the checksum lines
    and the sanitizer's error summary; it has no step time."""

    def __init__(self, shim, logdir):
        self.shim, self.logdir = shim, logdir
        self.binary = os.path.join(logdir, "legacy_loop")

    def available(self):
        nvcc = subprocess.run(["sh", "-c", "command -v nvcc && command -v compute-sanitizer"], capture_output=True)
        if nvcc.returncode != 0:
            return False
        build = subprocess.run(["nvcc", "-O2", "-arch=sm_90", "-cudart", "shared", "-o", self.binary,
                                os.path.join(ROOT, "c_tests/demo/legacy_loop.cu")], capture_output=True, text=True)
        if build.returncode != 0:
            print(build.stderr, file=sys.stderr)
        return build.returncode == 0

    def run(self, preload):
        target = ["env", f"LD_PRELOAD={self.shim}", self.binary, "2000"] if preload else [self.binary, "2000"]
        rc, out, err = run(["compute-sanitizer", "--tool", "memcheck", "--error-exitcode", "99"] + target, {})
        lines = [l for l in (out + err).splitlines() if "checksum" in l.lower() or "ERROR SUMMARY" in l]
        return rc, {"result": lines, "ms": None, "mib": None}, out + err


def versions():
    """The installed frameworks' versions (their package metadata: nothing is imported)."""
    distributions = {"torch": ["torch"], "transformers": ["transformers"], "jax": ["jax"], "jaxlib": ["jaxlib"],
                     "cupy": ["cupy-cuda13x", "cupy-cuda12x", "cupy"], "triton": ["triton"]}
    found = {}
    for name, candidates in distributions.items():
        found[name] = "-"
        for candidate in candidates:
            try:
                found[name] = importlib.metadata.version(candidate)
                break
            except importlib.metadata.PackageNotFoundError:
                pass
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout.strip().replace("\n", "; ")
    except OSError:
        smi = "no nvidia-smi (no GPU)"
    return found, smi


def fmt_ms(ms):
    return "-" if ms is None else f"{ms:.3f}"


def pin_to_gpu_cpus():
    """Runs this process and its children on the CPUs of GPU 0's NUMA node, where known."""
    if os.environ.get("BENCH_PIN", "1") != "1":
        return "not pinned (BENCH_PIN)"
    listed = subprocess.run([os.path.join(ROOT, "scripts", "gpu_cpus.sh")], capture_output=True, text=True).stdout.strip()
    if not listed:
        return "not pinned (the CPUs of GPU 0 not found)"
    cpus = set()
    for part in listed.split(","):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    os.sched_setaffinity(0, cpus)
    return f"pinned to CPUs {listed}"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shim")
    parser.add_argument("--only", default="")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", default=os.path.join(ROOT, "build", "compat"))
    args = parser.parse_args()
    shim = os.path.abspath(args.shim)
    os.makedirs(args.out, exist_ok=True)
    found, machine = versions()
    machine += "; " + pin_to_gpu_cpus()
    sanitized = Sanitized(shim, args.out)
    wanted = [row for row in ROWS if re.search(args.only, row.name)]
    have = {m: found.get(m, "-") != "-" for m in ("torch", "transformers", "jax", "cupy")}
    have["compute-sanitizer"] = any(row.needs == "compute-sanitizer" for row in wanted) and sanitized.available()

    def one(program, env, preload, tag):
        if program == ["sanitizer"]:
            rc, res, text = sanitized.run(preload)
        else:
            extra = {"LD_PRELOAD": shim} if preload else {}
            rc, out, err = run([sys.executable, os.path.join(COMPAT, program[0])] + program[1:], {**env, **extra})
            res, text = result_of(out), out + err
        with open(os.path.join(args.out, f"{tag}.log"), "a") as log:
            log.write(f"=== rc={rc}\n{text}\n")
        return rc, res

    def runs_of(program, env, preload, tag):
        """(exit status, result, ms, MiB) of one run; a run failing or printing
        no RESULT is (non-zero, None, None, None)."""
        rc, res = one(program, env, preload, tag)
        if rc != 0 or not res:
            return rc or 1, None, None, None
        return 0, res["result"], res["ms"], res["mib"]

    table, ratio_lines, failures = [], [], 0
    for index, row in enumerate(ROWS):
        if row not in wanted:
            continue
        if not have.get(row.needs, False):
            table.append((row.name, "not installed", "", "skipped", "", "", "", "", "", "", ""))
            continue
        tag = f"row{index:02d}"
        for f in (f"{tag}.native", f"{tag}.shim", f"{tag}.own", f"{tag}.again"):
            open(os.path.join(args.out, f + ".log"), "w").close()
        # Round by round: native, shim, the own allocator, native again (the noise floor).
        runs = {"native": {}, "shim": {}, "own": {}, "again": {}}
        for r in range(args.rounds):
            runs["native"][r] = runs_of(row.program, row.env, False, f"{tag}.native")
            runs["shim"][r] = runs_of(row.program, row.env, True, f"{tag}.shim")
            if row.own:
                runs["own"][r] = runs_of(row.own[0], row.own[1], False, f"{tag}.own")
            if args.rounds > 1:
                runs["again"][r] = runs_of(row.program, row.env, False, f"{tag}.again")
        rcs = {k: next((o[0] for o in v.values() if o[0] != 0), 0) for k, v in runs.items()}
        results = {k: [o[1] for o in v.values()] for k, v in runs.items()}
        ms = {k: {r: o[2] for r, o in v.items()} for k, v in runs.items()}
        mib = {k: max((o[3] for o in v.values() if o[3] is not None), default=None) for k, v in runs.items()}
        if rcs["native"] != 0 or rcs["shim"] != 0:
            verdict = f"FAILED (native exit {rcs['native']}, shim exit {rcs['shim']})"
        elif any(res != results["native"][0] for res in results["native"] + results["again"]):
            verdict = "native runs differ"
        else:
            verdict = "identical" if all(res == results["native"][0] for res in results["shim"]) else "DIFFERS"
        failures += verdict != "identical"
        show = lambda rs: json.dumps(rs[0])[:60] if rs and rs[0] is not None else "-"
        median_ms = lambda k: ratios.median(list(ms[k].values()))
        own_cell = ratios.cell(ratios.per_round(ms["shim"], ms["own"])) if row.own else "-"
        noise = ratios.cell(ratios.per_round(ms["again"], ms["native"])) if args.rounds > 1 else "-"
        if args.rounds > 1:
            # Against the program's own allocator where it has one, else native; the noise beside it.
            reference = "own" if row.own else "native"
            ratio_lines.append(ratios.ratio_line(row.name, ratios.per_round(ms["shim"], ms[reference]), reference,
                                                 ratios.per_round(ms["again"], ms["native"])))
        table.append((row.name, show(results["native"]), show(results["shim"]), verdict, fmt_ms(median_ms("native")),
                      fmt_ms(median_ms("shim")), ratios.cell(ratios.per_round(ms["shim"], ms["native"])), own_cell,
                      noise, f"{mib['native'] or '-'} / {mib['shim'] or '-'}" + (f" / {mib['own']}" if mib["own"] else ""),
                      " ".join(f"{k}={v}" for k, v in row.env.items())))
        print(f"{verdict:10} {row.name}", flush=True)

    header = ("program", "native result", "shim result", "identical", "native ms", "shim ms", "shim/native",
              "shim/own allocator", "noise (native/native)", "MiB native / shim / own", "environment (both runs)")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in table]
    with open(shim, "rb") as f:
        shim_hash = hashlib.sha256(f.read()).hexdigest()[:16]
    report = [
        f"Command: `{' '.join(shlex.quote(a) for a in ['scripts/compat.py'] + sys.argv[1:])}`, "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"Machine: {machine}; shim {shim_hash}; rounds {args.rounds}",
        f"ms: the median over the rounds of each run's median step; {ratios.LEGEND}.",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in sorted(found.items())),
        "",
    ] + lines + ([""] + ratio_lines if ratio_lines else [])
    text = "\n".join(report) + "\n"
    with open(os.path.join(args.out, "COMPATIBILITY.md"), "w") as f:
        f.write(text)
    print()
    print(text)
    print(f"{sum(1 for r in table if r[3] == 'identical')} passed, {failures} failed, "
          f"{sum(1 for r in table if r[3] == 'skipped')} skipped")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
