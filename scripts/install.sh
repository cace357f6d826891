#!/usr/bin/env bash
# Install the shim and its launcher (`make install PREFIX=...` runs this):
#
#   scripts/install.sh PREFIX path/to/libsomashim.so
#
# puts LIB at PREFIX/lib/libsomashim.so and scripts/somarun at PREFIX/bin/somarun
# (both mode 755), creating the directories; somarun finds the library there by
# itself (../lib from its own directory). DESTDIR, if set, is prepended to both
# (staged installs: the files land in $DESTDIR$PREFIX). Relative paths are taken
# from the caller's directory. Errors: a line to stderr, exit 2.
set -euo pipefail

if [ $# -ne 2 ] || [ -z "$1" ] || [ -z "$2" ]; then
  echo "usage: $0 PREFIX path/to/libsomashim.so" >&2
  exit 2
fi
PREFIX=$1
LIB=$2
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

DEST=${DESTDIR:-}$PREFIX
install -d -m 755 -- "$DEST/lib" "$DEST/bin"
install -m 755 -- "$LIB" "$DEST/lib/libsomashim.so"
install -m 755 -- "$LAUNCHER" "$DEST/bin/somarun"
echo "installed $DEST/lib/libsomashim.so"
echo "installed $DEST/bin/somarun"
