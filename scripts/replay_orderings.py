#!/usr/bin/env python3
"""What a pool would have to reserve if ordering the frees took longer or shorter.

    python3 scripts/replay_orderings.py trace.csv [--latency-us 0,100,200,450]

Reads a SOMA_TRACE file (time_us,device,op,size,...) and replays its allocations and
frees, per device, against a model: a `cudaFree` is reusable only once an ordering that
began after it has ended; one ordering runs at a time and takes the given latency, and
the frees that arrive meanwhile wait for the next one, which begins when it ends (as
the shim's thread does past SOMA_PENDING_FREE_LIMIT). A `cudaFreeAsync` is reusable at
once. The model's pool is ideal: any freed byte serves any later request, so it grows
only when the reusable bytes fall short. The figures are a model, not a measurement:
a real pool also keeps memory its blocks' sizes and streams leave unused, so only the
differences between latencies carry over, not the figures themselves.
Prints, per device and latency, the model pool's peak and the most bytes that waited
for an ordering at once.
"""
import argparse
import csv
import sys
from collections import defaultdict

MIB = 1 << 20


def replay(events, latency_us):
    """events: (time_us, op, size) in time order. Returns (pool peak, most bytes waiting)."""
    reserved = reusable = queued = 0
    ordering = None  # (end time, bytes it orders)
    most_waiting = 0

    def settle(now):
        nonlocal ordering, reusable, queued
        while ordering and ordering[0] <= now:
            end, freed = ordering
            reusable += freed
            ordering = (end + latency_us, queued) if queued else None
            queued = 0

    for time_us, op, size in events:
        settle(time_us)
        if op == "alloc":
            taken = min(reusable, size)
            reusable -= taken
            reserved += size - taken
        elif op == "free_async":
            reusable += size
        elif op == "free":
            queued += size
            if ordering is None:
                ordering = (time_us + latency_us, queued)
                queued = 0
            settle(time_us)
        waiting = queued + (ordering[1] if ordering else 0)
        most_waiting = max(most_waiting, waiting)
    return reserved, most_waiting


def read(path):
    """Device ordinal -> its (time_us, op, size) events, in time order."""
    devices = defaultdict(list)
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row["op"] in ("alloc", "free", "free_async"):
                devices[int(row["device"])].append((int(row["time_us"]), row["op"], int(row["size"])))
    for events in devices.values():
        events.sort(key=lambda e: e[0])  # each thread's rows reach the file in its own order
    return devices


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("trace", help="a SOMA_TRACE file")
    p.add_argument("--latency-us", default="0,100,200,450",
                   help="comma-separated host times of one ordering, us (default 0,100,200,450)")
    args = p.parse_args(argv)
    try:
        latencies = [float(x) for x in args.latency_us.split(",")]
    except ValueError:
        p.error(f"--latency-us: not a list of numbers: {args.latency_us!r}")
    devices = read(args.trace)
    if not devices:
        print(f"{args.trace}: no allocations or frees", file=sys.stderr)
        return 1
    print("device  ordering us  model pool peak MiB  most waiting MiB")
    for device, events in sorted(devices.items()):
        for latency in latencies:
            peak, waiting = replay(events, latency)
            print(f"{device:>6}  {latency:>11g}  {peak / MIB:>19.1f}  {waiting / MIB:>16.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
