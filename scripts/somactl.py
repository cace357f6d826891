#!/usr/bin/env python3
"""somactl: the shim processes of this user on this node (`somarun --ps`,
`somarun --trim PID`, `somarun --snapshot PID` run it).

  somactl.py ps [--json]     every shim process, per device: in use, cached,
                             freed and not yet reusable, pool reserved, pinned
                             host pool, peak in use, given back so far
  somactl.py trim [--json] PID   makes process PID give back what its pools
                             hold unused (its program's memory stays)
  somactl.py snapshot [--json] PID   makes process PID write what holds its
                             device memory now to PID.snapshot.json in the
                             socket directory, and prints its summary

Each process answers on its socket in $SOMA_SOCKET_DIR, by default
/tmp/somashim-<uid> (the protocol:
src/peers/wire.rs, ops 3 to 6). A process that does not answer within a
second is shown as such. --json: one JSON object per line, per process.
Exit status: 0; 1 if `trim` found no such process or it did not answer; 2 on
a usage error.
"""
import json
import os
import socket
import struct
import sys

REQUEST_LEN, REPLY_LEN = 68, 76
GIVE_BACK, USAGE, LIBRARY, SNAPSHOT = 3, 4, 5, 6
FIGURES = ("in_use", "cached", "freed_not_reused", "reserved", "peak_in_use", "given_back")
TIMEOUT_S = 1.0


def socket_dir():
    return os.environ.get("SOMA_SOCKET_DIR") or f"/tmp/somashim-{os.geteuid()}"


def processes():
    """(pid, socket path) of every live shim process of this user."""
    try:
        names = os.listdir(socket_dir())
    except OSError:
        return []
    found = []
    for name in sorted(names):
        pid, _, _ = name.partition("-")
        if pid.isdigit() and os.path.exists(f"/proc/{pid}"):
            found.append((int(pid), os.path.join(socket_dir(), name)))
    return found


def ask(path, request):
    """The reply (status, second field, data) to one request, or None."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(TIMEOUT_S)
            s.connect(path)
            s.sendall(request)
            reply = b""
            while len(reply) < REPLY_LEN:
                chunk = s.recv(REPLY_LEN - len(reply))
                if not chunk:
                    return None
                reply += chunk
    except OSError:
        return None
    status, second = struct.unpack_from("<IQ", reply)
    return status, second, reply[12:]


def uuid_text(raw):
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def command(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def usage(path):
    """Per device ordinal, its figures (and the pinned host pool's reserved
    bytes); None if the process did not answer."""
    devices = {}
    for index in range(256):
        reply = ask(path, struct.pack("<II", USAGE, index).ljust(REQUEST_LEN, b"\0"))
        if reply is None:
            return None if index == 0 else devices
        status, where, data = reply
        if status != 0:
            return devices
        ordinal, host = where & 0xFFFFFFFF, where >> 32
        values = dict(zip(FIGURES, struct.unpack_from("<6Q", data, 16)))
        entry = devices.setdefault(ordinal, {"device": ordinal, "uuid": uuid_text(data[:16]), "pinned_host_pool": 0})
        if host:
            entry["pinned_host_pool"] = values["reserved"]
        else:
            entry.update(values)
    return devices


def libraries(path):
    """The libraries that allocated device memory in the process, the most
    in use first: name, in use, peak, allocations. (The process lists them in
    the order it first saw them, which only grows: none is missed or repeated.)"""
    found = []
    for index in range(64):
        reply = ask(path, struct.pack("<II", LIBRARY, index).ljust(REQUEST_LEN, b"\0"))
        if reply is None or reply[0] != 0:
            break
        _, in_use, data = reply
        peak, allocations = struct.unpack_from("<2Q", data)
        name = data[16:64].split(b"\0", 1)[0].decode(errors="replace")
        found.append({"name": name, "in_use": in_use, "peak": peak, "allocations": allocations})
    return sorted(found, key=lambda lib: (-lib["in_use"], -lib["peak"], lib["name"]))


def human(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def ps(as_json):
    rows = []
    for pid, path in processes():
        devices = usage(path)
        entry = {"pid": pid, "command": command(pid), "answered": devices is not None,
                 "devices": sorted((devices or {}).values(), key=lambda d: d["device"]),
                 "libraries": libraries(path) if devices is not None else []}
        rows.append(entry)
        if as_json:
            print(json.dumps(entry), flush=True)
    if as_json:
        return 0
    header = ("PID", "DEV", "IN USE", "CACHED", "FREED", "RESERVED", "PINNED", "PEAK", "GIVEN BACK", "COMMAND")
    print("%7s %3s %10s %10s %10s %10s %10s %10s %10s  %s" % header)
    for entry in rows:
        if not entry["answered"]:
            print("%7d %3s %65s  %s" % (entry["pid"], "-", "(no answer)", entry["command"][:60]))
        for d in entry["devices"]:
            cells = [human(d.get(k, 0)) for k in ("in_use", "cached", "freed_not_reused", "reserved", "pinned_host_pool", "peak_in_use", "given_back")]
            print("%7d %3d %10s %10s %10s %10s %10s %10s %10s  %s" % (entry["pid"], d["device"], *cells, entry["command"][:60]))
        top = [f"{lib['name']} {human(lib['in_use'])}" for lib in entry["libraries"][:3] if lib["in_use"] > 0]
        if top:
            print("%7s %3s in use by library: %s" % ("", "", ", ".join(top)))
    return 0


def ask_process(pid, op, as_json):
    """Process pid's reply to a request of `op`, or None once the error is said."""
    paths = [path for p, path in processes() if p == pid]
    request = struct.pack("<I", op).ljust(REQUEST_LEN, b"\0")
    # A process that exec'd keeps its pid: an earlier program's socket may be there too.
    reply = next((r for r in (ask(path, request) for path in paths) if r is not None), None)
    if reply is None or reply[0] != 0:
        why = "no shim process of this user" if not paths else "no answer" if reply is None else "refused"
        print(json.dumps({"pid": pid, "error": why}) if as_json else f"somactl: {pid}: {why}", file=None if as_json else sys.stderr)
        return None
    return reply


def trim(pid, as_json):
    reply = ask_process(pid, GIVE_BACK, as_json)
    if reply is None:
        return 1
    print(json.dumps({"pid": pid, "given_back": reply[1]}) if as_json else f"{pid}: {human(reply[1])} given back")
    return 0


def snapshot(pid, as_json):
    if ask_process(pid, SNAPSHOT, as_json) is None:
        return 1
    path = os.path.join(socket_dir(), f"{pid}.snapshot.json")
    if as_json:
        print(json.dumps({"pid": pid, "snapshot": path}))
        return 0
    print(f"{pid}: snapshot written to {path}")
    try:
        import snapshot_viz  # beside this script
    except ImportError:
        return 0
    with open(path) as f:
        print(snapshot_viz.summary(json.load(f)))
    return 0


def main(argv):
    as_json = "--json" in argv
    args = [a for a in argv if a != "--json"]
    if args == ["ps"]:
        return ps(as_json)
    if len(args) == 2 and args[0] in ("trim", "snapshot") and args[1].isdigit():
        return (trim if args[0] == "trim" else snapshot)(int(args[1]), as_json)
    print("usage: somactl.py ps [--json] | somactl.py trim [--json] PID | somactl.py snapshot [--json] PID", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
