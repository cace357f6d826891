#!/usr/bin/env python3
"""Time `import MODULE` in fresh processes: what the preload costs a process that
loads the CUDA libraries and allocates nothing (docs/CONTRACT.md, row 13).

    python3 scripts/bench_import.py --module torch
    LD_PRELOAD=target/release/libsomashim.so python3 scripts/bench_import.py --module torch

Each of --imports processes (after --warmup more, which fill the page cache) runs
`python -c "import MODULE"` with this process's environment, the preload included;
the time is the process's wall time, start to exit. Check: every process exits 0
with nothing on stderr ("check_ok").

Output: one JSON line on stdout (ms_per_import_median and each process's time);
on an error the line has "error" and the exit status is 1.
"""
import argparse
import json
import statistics
import subprocess
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--module", default="torch")
    ap.add_argument("--imports", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    result = {"bench": "import", "label": args.label, "module": args.module}
    times = []
    for i in range(args.warmup + args.imports):
        start = time.perf_counter()
        run = subprocess.run([sys.executable, "-c", f"import {args.module}"], capture_output=True, text=True)
        elapsed_ms = (time.perf_counter() - start) * 1000.0
        if run.returncode != 0 or run.stderr.strip():
            result["error"] = f"import {args.module}: exit status {run.returncode}, stderr: {run.stderr.strip()[:300]}"
            result["check_ok"] = False
            print(json.dumps(result), flush=True)
            return 1
        if i >= args.warmup:
            times.append(elapsed_ms)
    result.update(ms_per_import=[round(t, 1) for t in times], ms_per_import_median=statistics.median(times),
                  check_ok=True)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
