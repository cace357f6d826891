"""What every compatibility program shares: rounding results so that two runs
compare, timing steady steps, and the one line the runner reads.

A program prints, last on stdout:
    RESULT {"result": <what must be identical>, "ms": <median step>, "mib": <device memory>}
"""
import json
import os
import statistics
import subprocess
import sys
import time


def rounded(values, digits=6):
    """Floats to `digits` significant digits: what is compared between runs."""
    if isinstance(values, (list, tuple)):
        return [rounded(v, digits) for v in values]
    return float(f"{float(values):.{digits}g}")


def device_mib():
    """Device memory this process holds, as nvidia-smi sees it (pools and caches included)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 2 and fields[0] == str(os.getpid()) and fields[1].isdigit():
            return int(fields[1])
    return None


class Steps:
    """Times each step (the caller synchronizes the device before `done`)."""

    def __init__(self):
        self.ms = []
        self.t0 = None

    def start(self):
        self.t0 = time.perf_counter()

    def done(self):
        self.ms.append((time.perf_counter() - self.t0) * 1e3)

    def median(self):
        return statistics.median(self.ms) if self.ms else None


def finish(result, steps, mib=None, failed=False):
    """Prints the RESULT line; `failed`: the program could not do its work,
    so it exits 1 (a failure both runs share must not read as identical)."""
    print("RESULT " + json.dumps({"result": result, "ms": steps.median(), "mib": mib if mib is not None else device_mib()}),
          flush=True)
    if failed:
        sys.exit(1)
