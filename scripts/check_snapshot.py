#!/usr/bin/env python3
"""Checks an out-of-memory snapshot (SOMA_SNAPSHOT) and the memory-viewer file
snapshot_viz.py made of it, for the test suites:

    check_snapshot.py SNAPSHOT.json VIEWER.pickle [--largest LIBRARY]

The snapshot must account for itself: its live blocks add up to what its pools
and its libraries say is in use, each block names a library of the table, and,
at an out-of-memory, the device had less free than was asked for. The viewer's
file must be what torch.cuda._memory_viz reads: segments whose blocks fill them
exactly (its `stats` asserts that), active blocks with a frame naming their
library, and a device trace that ends with the out-of-memory, if it was one. --largest: the library holding
the most. Prints 'ok' and exits 0, or the problems and exits 1."""
import json
import pickle
import sys


def problems_of(snap, viewer, largest):
    problems = []
    if snap.get("format") != "somashim-snapshot-1":
        return ["not a somashim snapshot"]
    device = snap["device"]
    blocks = [b for b in snap["blocks"] if b["device"] == device]
    held = sum(b["size"] for b in blocks)
    in_use = sum(p["in_use"] for p in snap["pools"] if p["device"] == device)
    if held != in_use:
        problems.append(f"the live blocks hold {held} bytes, the pools say {in_use} in use")
    names = {lib["name"] for lib in snap["libraries"]}
    strays = {b["library"] for b in snap["blocks"]} - names
    if strays:
        problems.append(f"blocks name libraries the table lacks: {sorted(strays)}")
    by_library = sum(lib["in_use"] for lib in snap["libraries"])
    if by_library != sum(b["size"] for b in snap["blocks"]):
        problems.append(f"the libraries hold {by_library} bytes, the blocks {sum(b['size'] for b in snap['blocks'])}")
    out_of_memory = snap["reason"] == "out of memory"
    if out_of_memory and not snap["requested"] > snap["device_free"]:
        problems.append(f"{snap['requested']} bytes asked for with {snap['device_free']} free: no out-of-memory")
    if not snap["events"]:
        problems.append("no pool events")
    if largest and (not snap["libraries"] or snap["libraries"][0]["name"] != largest):
        problems.append(f"the largest holder is not {largest}: {[lib['name'] for lib in snap['libraries'][:3]]}")
    for seg in viewer["segments"]:
        if sum(b["size"] for b in seg["blocks"]) != seg["total_size"]:
            problems.append(f"segment at {seg['address']:#x}: its blocks do not fill it")
        for b in seg["blocks"]:
            if b["state"] == "active_allocated" and not (b["frames"] and b["frames"][0]["name"] in names):
                problems.append(f"block at {b['address']:#x} names no library")
    active = sum(b["size"] for seg in viewer["segments"] for b in seg["blocks"] if b["state"] == "active_allocated")
    if active != sum(b["size"] for b in snap["blocks"]):
        problems.append(f"the viewer's active blocks hold {active} bytes")
    trace = viewer["device_traces"][device]
    ends_in_oom = bool(trace) and trace[-1]["action"] == "oom" and trace[-1]["size"] == snap["requested"]
    if ends_in_oom != out_of_memory:
        problems.append("the device trace does not end with the out-of-memory" if out_of_memory else "an out-of-memory in a snapshot asked for")
    return problems


def main(argv):
    largest = argv[argv.index("--largest") + 1] if "--largest" in argv else None
    with open(argv[0]) as f:
        snap = json.load(f)
    with open(argv[1], "rb") as f:
        viewer = pickle.load(f)
    problems = problems_of(snap, viewer, largest)
    print("ok" if not problems else "; ".join(problems))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
