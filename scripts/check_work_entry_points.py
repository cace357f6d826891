#!/usr/bin/env python3
"""Checks the shim's list of driver calls that issue work on a stream
(`work_entry_points!` in src/lib.rs) against the CUDA headers.

Every function the headers declare with a stream among its parameters (or
in a launch configuration it points to) must be either on the list, with as
many arguments as the header gives it and its stream where the header puts
it, or below in NOT_WORK, with the reason it issues no work that could use a
freed block. So must every per-thread variant of a synchronous call (`_ptds`):
it works on the per-thread default stream, which the legacy stream does not
order. A function the shim misses would let work run unseen on a stream the
shim then skips (docs/DESIGN.md, "Streams in use").

usage: check_work_entry_points.py CUDA_INCLUDE_DIR src/lib.rs
Prints each problem, then "N checked, M problems"; exits 1 on any problem.
"""

import re
import sys
from pathlib import Path

# Functions that take a stream but issue no work on it, or none that reads or
# writes memory: what an ordering needs to see is every such access.
NOT_WORK = {
    "cuEventRecord": "records an event, touches no memory",
    "cuEventRecordWithFlags": "as cuEventRecord",
    "cuStreamWaitEvent": "orders the stream, touches no memory",
    "cuStreamBeginCapture": "captured work runs when its graph is launched (cuGraphLaunch)",
    "cuStreamBeginCaptureToGraph": "as cuStreamBeginCapture",
    "cuStreamEndCapture": "ends a capture",
    "cuStreamUpdateCaptureDependencies": "edits a capture's graph",
    "cuStreamGetCaptureInfo": "a query",
    "cuStreamIsCapturing": "a query",
    "cuStreamQuery": "a query",
    "cuStreamSynchronize": "a host wait",
    "cuStreamGetAttribute": "a query",
    "cuStreamSetAttribute": "a stream attribute",
    "cuStreamCopyAttributes": "stream attributes",
    "cuStreamGetCtx": "a query",
    "cuStreamGetDevice": "a query",
    "cuStreamGetFlags": "a query",
    "cuStreamGetGreenCtx": "a query",
    "cuStreamGetId": "a query",
    "cuStreamGetPriority": "a query",
    "cuStreamCreate": "makes a stream (the stream hooks register it)",
    "cuStreamCreateWithPriority": "as cuStreamCreate",
    "cuStreamDestroy": "the stream hooks keep its last work as a tail",
    "cuGreenCtxStreamCreate": "a green context's stream; the shim does not pool green contexts",
    "cuMemAllocAsync": "the program's own stream-ordered allocation, not a pool block of the shim's",
    "cuMemAllocFromPoolAsync": "as cuMemAllocAsync",
    "cuMemFreeAsync": "served by the free hooks",
    "cuOccupancyMaxActiveClusters": "a query (reads a launch configuration)",
    "cuOccupancyMaxPotentialClusterSize": "a query (reads a launch configuration)",
    # EGL streams (embedded platforms): a frame passes by value (a struct
    # over 8 bytes, which a pass-through of integer arguments cannot forward).
    "cuEGLStreamConsumerAcquireFrame": "EGL stream interop, not wrapped (embedded platforms)",
    "cuEGLStreamConsumerReleaseFrame": "EGL stream interop, not wrapped (embedded platforms)",
    "cuEGLStreamProducerPresentFrame": "EGL stream interop, not wrapped (embedded platforms)",
    "cuEGLStreamProducerReturnFrame": "EGL stream interop, not wrapped (embedded platforms)",
}

VARIANT = re.compile(r"(_v\d+)?(_ptsz|_ptds)?$")


def base_name(name):
    """cuStreamWaitValue32_v2_ptsz -> cuStreamWaitValue32."""
    return VARIANT.sub("", name)


def declarations(include_dir):
    """name -> list of parameter strings, for every name the driver exports.
    A later declaration wins (the headers end with the exported older
    variants' own signatures). The per-thread variants are declared through
    macros: `#define cuMemcpyAsync __CUDA_API_PTSZ(cuMemcpyAsync)` names
    cuMemcpyAsync_ptsz, with the signature cuMemcpyAsync is declared with."""
    first, last, macros = {}, {}, []
    for header in sorted(Path(include_dir).glob("cuda*.h")):
        text = header.read_text(errors="replace")
        for m in re.finditer(r"CUresult\s+CUDAAPI\s+(\w+)\s*\(([^;]*?)\)\s*;", text, re.S):
            params = [" ".join(p.split()) for p in m.group(2).split(",")]
            params = [] if params == ["void"] else params
            first.setdefault(m.group(1), params)
            last[m.group(1)] = params
        macros += re.findall(r"#define\s+(\w+)\s+__CUDA_API_PT(SZ|DS)\((\w+)\)", text)
    found = dict(last)
    for macro, kind, target in macros:
        if macro in first:
            for name in (target, f"{target}_pt{kind.lower()}"):
                found.setdefault(name, first[macro])
    return found


def takes_stream(params):
    return any(re.search(r"\bCUstream\b|\bCUlaunchConfig\b|\bCUDA_LAUNCH_PARAMS\b", p) for p in params)


def work_list(lib_rs):
    text = Path(lib_rs).read_text()
    block = text[text.index("work_entry_points! {"):]
    block = block[: block.index("\n}\n")]
    entries = {}
    for m in re.finditer(r"^\s*(\w+)\(([^)]*)\) => (.*);$", block, re.M):
        args = [a.strip() for a in m.group(2).split(",") if a.strip()]
        entries[m.group(1)] = (args, m.group(3).strip())
    return entries


def check(decls, entries):
    problems = []
    checked = 0
    for name, (args, streams) in sorted(entries.items()):
        checked += 1
        params = decls.get(name)
        if params is None:
            problems.append(f"{name}: on the list, not declared in the headers")
            continue
        if len(args) != len(params):
            problems.append(f"{name}: {len(args)} arguments on the list, {len(params)} in the header")
            continue
        single = re.fullmatch(r"\[stream\((\w+)\)\]", streams)
        if single:
            index = args.index(single.group(1)) if single.group(1) in args else -1
            if index < 0 or not re.fullmatch(r"(const )?CUstream \w+", params[index]):
                problems.append(f"{name}: argument {index} is '{params[index] if index >= 0 else '?'}', not a stream")
        elif streams.startswith("front::work::launch_config_stream("):
            if "CUlaunchConfig" not in params[0]:
                problems.append(f"{name}: its first parameter is '{params[0]}', not a launch configuration")
        elif streams == "front::work::per_thread_stream()":
            if not name.endswith("_ptds"):
                problems.append(f"{name}: given the per-thread default stream, but not a _ptds variant")
        elif streams.startswith("front::work::launch_list_streams("):
            if "CUDA_LAUNCH_PARAMS" not in params[0] or "int" not in params[1]:
                problems.append(f"{name}: '{params[0]}, {params[1]}' is not a list of launches and its length")
        else:
            problems.append(f"{name}: streams given as '{streams}', which this check cannot read")
    for name, params in sorted(decls.items()):
        if name in entries:
            continue
        if name.endswith("_ptds"):
            checked += 1
            problems.append(f"{name}: works on the per-thread default stream, not on the list")
        elif takes_stream(params):
            checked += 1
            if base_name(name) not in NOT_WORK and name not in NOT_WORK:
                problems.append(f"{name}({', '.join(params)}): takes a stream, neither on the list nor known to issue no work")
    return checked, problems


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    decls = declarations(sys.argv[1])
    entries = work_list(sys.argv[2])
    if len(decls) < 100 or len(entries) < 10:
        print(f"found {len(decls)} declarations and {len(entries)} entries: wrong paths?")
        sys.exit(1)
    checked, problems = check(decls, entries)
    for problem in problems:
        print(problem)
    print(f"{checked} checked, {len(problems)} problems")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
