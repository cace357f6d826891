#!/usr/bin/env bash
# Install the shim and its launcher (`make install PREFIX=...` runs this):
#
#   scripts/install.sh PREFIX path/to/libsomashim.so
#
# puts LIB, without its debug info, at PREFIX/lib/libsomashim.so and
# scripts/somarun at PREFIX/bin/somarun and scripts/somactl.py at PREFIX/bin/somactl
# (all mode 755; somarun --ps and --trim run somactl), creating the
# directories; somarun finds the library there by itself (../lib from its own
# directory). LIB itself keeps its debug info, for developers' debuggers and
# profilers. DESTDIR, if set, is prepended to both (staged installs: the files
# land in $DESTDIR$PREFIX); STRIP names the strip program (default strip).
# Relative paths are taken from the caller's directory. Errors: a line to
# stderr, exit 2, and nothing installed.
set -euo pipefail

if [ $# -ne 2 ] || [ -z "$1" ] || [ -z "$2" ]; then
  echo "usage: $0 PREFIX path/to/libsomashim.so" >&2
  exit 2
fi
PREFIX=$1
LIB=$2
STRIP=${STRIP:-strip}
HERE=$(dirname -- "$(readlink -f -- "${BASH_SOURCE[0]}")")
LAUNCHER=$HERE/somarun

if [ ! -f "$LIB" ]; then
  echo "install: library '$LIB' not found (build it first: cargo build --release)" >&2
  exit 2
fi
if [ ! -f "$LAUNCHER" ]; then
  echo "install: launcher '$LAUNCHER' not found" >&2
  exit 2
fi

# Debug info is most of the release build (Cargo.toml: debug = 1): the
# installed copy goes without it.
STRIPPED=$(mktemp)
trap 'rm -f -- "$STRIPPED"' EXIT
if ! "$STRIP" --strip-debug -o "$STRIPPED" -- "$LIB"; then
  echo "install: '$STRIP --strip-debug' failed on '$LIB' (set STRIP to a strip program)" >&2
  exit 2
fi

DEST=${DESTDIR:-}$PREFIX
install -d -m 755 -- "$DEST/lib" "$DEST/bin"
install -m 755 -- "$STRIPPED" "$DEST/lib/libsomashim.so"
install -m 755 -- "$LAUNCHER" "$DEST/bin/somarun"
install -m 755 -- "$HERE/somactl.py" "$DEST/bin/somactl"
echo "installed $DEST/lib/libsomashim.so"
echo "installed $DEST/bin/somarun"
echo "installed $DEST/bin/somactl"
