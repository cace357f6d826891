#!/usr/bin/env python3
"""Checks SOMA_STATS' "device memory by library" table of a PyTorch program
(c_tests/gpu/torch_libraries.py), for scripts/gpu_test.sh:

    library_rows.py STATS_FILE RESERVED_BYTES

ok when libc10_cuda.so holds what torch.cuda.memory_reserved() said (within
one 20 MiB segment), NCCL's library allocated, and a third object (the
program's own cudaMalloc, through libffi) holds its 64 MiB. Prints 'ok: ...'
or 'wrong: ...' with the rows read."""
import re
import sys

UNITS = {"MiB": 1 << 20}
ROW = re.compile(r"^  (\S+)\s+([\d.]+ \w+)\s+([\d.]+ \w+)\s+(\d+)\s+(.*)$")


def size(text):
    number, unit = text.split()
    return float(number) * UNITS[unit]


def rows(path):
    found, inside = {}, False
    for line in open(path):
        if line.startswith("device memory by library"):
            inside = True
        elif inside and not line.startswith("  "):
            break
        elif inside and (m := ROW.match(line)):
            found[m[1]] = {"in_use": size(m[2]), "peak": size(m[3]), "allocations": int(m[4])}
    return found


def main():
    path, reserved = sys.argv[1], int(sys.argv[2])
    table = rows(path)
    problems = []
    torch_row = table.get("libc10_cuda.so")
    if not torch_row:
        problems.append("no row for libc10_cuda.so")
    elif abs(torch_row["in_use"] - reserved) > 20 << 20:
        problems.append(f"libc10_cuda.so holds {torch_row['in_use']:.0f} bytes, PyTorch reserves {reserved}")
    if not any(name.startswith("libnccl") and row["peak"] > 0 for name, row in table.items()):
        problems.append("no allocation under libnccl")
    if not any(name != "libc10_cuda.so" and row["in_use"] >= 64 << 20 for name, row in table.items()):
        problems.append("no other object holds the program's own 64 MiB")
    summary = "; ".join(f"{name} {row['in_use'] / 2**20:.1f} MiB in use, peak {row['peak'] / 2**20:.1f} MiB, "
                        f"{row['allocations']} allocations" for name, row in table.items())
    print(("wrong: " + ", ".join(problems) + " | " if problems else "ok: ") + summary)


main()
