#!/usr/bin/env python3
"""Draw a SOMA_TRACE timeline: memory in use and reserved over time.

    python3 scripts/plot_trace.py TRACE.csv OUTPUT.png [--title TEXT]

TRACE.csv is what SOMA_TRACE=path writes: a header
`time_us,device,op,size,ptr,in_use,reserved` and one row per pool event
(alloc, free, free_async). One panel per device: bytes in use by the program
(as the shim counts it) and bytes the pool holds (reserved), against time.
"""
import argparse
import csv
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read(path):
    series = defaultdict(lambda: {"t": [], "in_use": [], "reserved": []})
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            s = series[int(row["device"])]
            s["t"].append(int(row["time_us"]) / 1e6)
            s["in_use"].append(int(row["in_use"]) / 2**20)
            s["reserved"].append(int(row["reserved"]) / 2**20)
    for s in series.values():  # threads flush their buffers separately
        order = sorted(range(len(s["t"])), key=s["t"].__getitem__)
        for key in s:
            s[key] = [s[key][i] for i in order]
    return series


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("output")
    parser.add_argument("--title", default="somashim: device memory over time")
    args = parser.parse_args()
    series = read(args.trace)
    if not series:
        sys.exit(f"{args.trace}: no events")
    fig, axes = plt.subplots(len(series), 1, figsize=(10, 3.2 * len(series)), squeeze=False)
    for ax, (device, s) in zip(axes[:, 0], sorted(series.items())):
        ax.step(s["t"], s["reserved"], where="post", label="reserved by the pool", color="tab:orange")
        ax.step(s["t"], s["in_use"], where="post", label="in use by the program", color="tab:blue")
        ax.set_title(f"device {device}: peak in use {max(s['in_use']):.0f} MiB, "
                     f"peak reserved {max(s['reserved']):.0f} MiB")
        ax.set_xlabel("time (s)")
        ax.set_ylabel("MiB")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left")
    fig.suptitle(args.title)
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
