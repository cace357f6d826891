#!/usr/bin/env python3
"""What held the GPU's memory when a program ran out of it, from the snapshot the
shim wrote (SOMA_SNAPSHOT=path):

    snapshot_viz.py SNAPSHOT.json [--pickle OUT.pickle] [--png OUT.png]

Prints a summary, the largest holders first: this process's pools, its memory by
library, its largest blocks, the other shim processes on the device, and what none of
them accounts for.

--pickle OUT: the snapshot in the format torch.cuda.memory._dump_snapshot writes
  (segments with their blocks, device traces), so that PyTorch's viewer draws it:
  python -m torch.cuda._memory_viz trace_plot OUT -o out.html (or the memory_viz
  page). Each live block is a segment of its own (the pool's segments are the
  driver's), the pool's unused memory one more; every block and event has one frame,
  the library that allocated it; the trace ends with the out-of-memory, if it was one.
--png OUT: a picture (needs matplotlib): the device's memory by holder at the
  out-of-memory, and the last pool events over time, one colour per library.

Needs Python 3.8 and nothing else (matplotlib for --png only)."""
import argparse
import json
import pickle
import sys

MiB = 1 << 20


def human(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def own_pools(snap):
    return [p for p in snap["pools"] if p["device"] == snap["device"]]


def summary(snap):
    lines = []
    free, total = snap["device_free"], snap["device_total"]
    if snap["reason"] == "out of memory":
        lines.append(f"out of memory on device {snap['device']} ({snap['uuid']}): {human(snap['requested'])} requested, "
                     f"{human(free)} free of {human(total)}")
    else:
        lines.append(f"device {snap['device']} ({snap['uuid']}), a snapshot asked for: {human(free)} free of {human(total)}")
    lines.append(f"this process: pid {snap['pid']}, {snap['command'][:100]}")
    reserved = 0
    for p in own_pools(snap):
        reserved += p["reserved"]
        lines.append(f"  the shim's pools: {human(p['in_use'])} in use, {human(p['cached'])} cached, "
                     f"{human(p['freed_not_reused'])} freed and not yet reusable, {human(p['reserved'])} reserved "
                     f"(peak in use {human(p['peak_in_use'])})")
    libraries = snap["libraries"]
    if libraries:
        lines.append("  device memory by library, the most in use first:")
        width = max(len(lib["name"]) for lib in libraries)
        for lib in libraries:
            passed = f", {lib['passed_calls']} passed to the real allocator ({human(lib['passed_bytes'])})" if lib["passed_calls"] else ""
            lines.append(f"    {lib['name']:<{width}}  {human(lib['in_use']):>10} in use, peak {human(lib['peak'])}, "
                         f"{lib['allocations']} allocations{passed}")
    blocks = sorted(snap["blocks"], key=lambda b: -b["size"])
    if blocks:
        lines.append(f"  largest of its {len(blocks)} live blocks:")
        for b in blocks[:8]:
            lines.append(f"    {human(b['size']):>10} at {b['address']:#x}, {b['library']}")
    others = snap["neighbours"]
    if others:
        lines.append("other shim processes on this device:")
        for o in sorted(others, key=lambda o: -o["reserved"]):
            lines.append(f"  pid {o['pid']}: {human(o['in_use'])} in use, {human(o['cached'])} cached, "
                         f"{human(o['reserved'])} reserved")
    used = total - free
    unaccounted = used - reserved - sum(o["reserved"] for o in others)
    lines.append(f"used on the device and held by none of these pools: {human(max(unaccounted, 0))} "
                 "(other processes, CUDA contexts, memory the program or its libraries got past the shim)")
    return "\n".join(lines)


def frames(library):
    return [{"filename": library, "line": 0, "name": library}]


def torch_snapshot(snap):
    """The dictionary torch.cuda.memory._snapshot() returns, as far as the
    viewer reads it."""
    device = snap["device"]
    segments = []
    for b in snap["blocks"]:
        block = {"address": b["address"], "size": b["size"], "requested_size": b["size"],
                 "state": "active_allocated", "frames": frames(b["library"])}
        segments.append({"device": b["device"], "address": b["address"], "total_size": b["size"],
                         "allocated_size": b["size"], "active_size": b["size"], "requested_size": b["size"],
                         "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
                         "frames": [], "blocks": [block]})
    unused = sum(p["reserved"] - p["in_use"] for p in own_pools(snap))
    if unused > 0:
        # Above every block: the pool's memory no block holds (cached, freed, unused).
        address = max((b["address"] + b["size"] for b in snap["blocks"]), default=0) + 2 * MiB
        block = {"address": address, "size": unused, "requested_size": 0, "state": "inactive", "frames": []}
        segments.append({"device": device, "address": address, "total_size": unused, "allocated_size": 0,
                         "active_size": 0, "requested_size": 0, "stream": 0, "segment_type": "large",
                         "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": [block]})
    traces = [[] for _ in range(max([device] + [e["device"] for e in snap["events"]]) + 1)]
    end = 0
    for e in snap["events"]:
        action = "alloc" if e["op"] == "alloc" else "free_completed"
        traces[e["device"]].append({"action": action, "addr": e["address"], "size": e["size"], "stream": 0,
                                    "time_us": e["time_us"], "frames": frames(e["library"])})
        end = max(end, e["time_us"])
    if snap["reason"] == "out of memory":
        traces[device].append({"action": "oom", "addr": 0, "size": snap["requested"], "stream": 0, "time_us": end + 1,
                               "device_free": snap["device_free"], "frames": []})
    return {"segments": segments, "device_traces": traces, "allocator_settings": {}}


def picture(snap, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    libraries = [lib["name"] for lib in snap["libraries"]]
    colour = {name: plt.cm.tab10(i % 10) for i, name in enumerate(libraries)}
    fig, (held, timeline) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [1, 2.2]})
    gib = 1 << 30
    bottom = 0.0
    for lib in snap["libraries"]:
        if lib["in_use"] > 0:
            held.bar(0, lib["in_use"] / gib, bottom=bottom, color=colour[lib["name"]], label=lib["name"])
            bottom += lib["in_use"] / gib
    unused = sum(p["reserved"] - p["in_use"] for p in own_pools(snap))
    if unused > 0:
        held.bar(0, unused / gib, bottom=bottom, color="lightgrey", label="the pool, unused")
        bottom += unused / gib
    for o in snap["neighbours"]:
        held.bar(0, o["reserved"] / gib, bottom=bottom, color="silver", hatch="//", label=f"shim process {o['pid']}")
        bottom += o["reserved"] / gib
    total = snap["device_total"] / gib
    other = max(total - snap["device_free"] / gib - bottom, 0)
    held.bar(0, other, bottom=bottom, color="white", edgecolor="grey", hatch="..", label="held past the shim")
    held.axhline(total, color="black", linewidth=1)
    held.text(-0.4, total, f" the device: {human(snap['device_total'])}", va="bottom", fontsize=8)
    asked = snap["requested"] / gib
    if asked > 1.2 * total:
        # Far beyond the device: drawn cut, its size written on it.
        held.bar(1, 1.15 * total, color="red", alpha=0.6, hatch="//", label="requested (cut)")
        held.text(1, 1.15 * total, human(snap["requested"]), ha="center", va="bottom", fontsize=8)
    else:
        held.bar(1, asked, color="red", alpha=0.6, label="requested")
    held.set_xticks([0, 1], ["on the device", "asked for"])
    held.set_ylabel("GiB")
    held.set_title(f"device {snap['device']} at the out-of-memory")
    held.legend(fontsize=7, loc="center left", bbox_to_anchor=(0.0, 0.55))
    in_use = {}
    series = {name: ([], []) for name in libraries}
    sizes = {}
    for e in snap["events"]:
        name = e["library"]
        if e["op"] == "alloc":
            sizes[e["address"]] = (e["size"], name)
            in_use[name] = in_use.get(name, 0) + e["size"]
        else:
            size, owner = sizes.pop(e["address"], (e["size"], name))
            in_use[owner] = in_use.get(owner, 0) - size
            name = owner
        xs, ys = series.setdefault(name, ([], []))
        xs.append(e["time_us"] / 1e6)
        ys.append(in_use[name] / gib)
    for name, (xs, ys) in series.items():
        if xs:
            timeline.step(xs, ys, where="post", color=colour.get(name, "grey"), label=name)
    timeline.set_xlabel("seconds (the last pool events kept)")
    timeline.set_ylabel("GiB allocated in these events, by library")
    timeline.set_title("the last pool events")
    timeline.legend(fontsize=7)
    what = f"out of memory: {human(snap['requested'])} asked for" if snap["reason"] == "out of memory" else "a snapshot asked for"
    fig.suptitle(f"{what}, {human(snap['device_free'])} free — pid {snap['pid']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("snapshot")
    parser.add_argument("--pickle", help="write PyTorch's memory-viewer file here")
    parser.add_argument("--png", help="draw a picture here (matplotlib)")
    args = parser.parse_args(argv)
    with open(args.snapshot) as f:
        snap = json.load(f)
    if snap.get("format") != "somashim-snapshot-1":
        print(f"snapshot_viz: {args.snapshot} is not a somashim snapshot", file=sys.stderr)
        return 2
    print(summary(snap))
    if args.pickle:
        with open(args.pickle, "wb") as f:
            pickle.dump(torch_snapshot(snap), f)
    if args.png:
        picture(snap, args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
