#!/usr/bin/env bash
# Installs what is missing, then mounts logfs in the foreground with the
# embedded default: data in ./data, mount at ./mnt.  Ctrl-C unmounts cleanly
# (flush, checkpoints, clean-shutdown marker).  Extra arguments go to
# `logfs mount` (e.g. -o num.partitions=3).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if grep -q " $PWD/mnt fuse" /proc/mounts; then
    if stat mnt >/dev/null 2>&1; then
        # a live logfs serves ./mnt: never unmount it under its users
        echo "run: ./mnt is served by a running logfs; unmount it first (fusermount3 -u mnt)" >&2
        exit 1
    fi
    echo "run: ./mnt is a stale mount of a logfs that died; detaching it first"
    fusermount3 -uz mnt
fi
mkdir -p mnt data
echo "run: mounting logfs at $PWD/mnt with data in $PWD/data (Ctrl-C to unmount)"
exec .venv/bin/logfs mount mnt --data-dir data "$@"
