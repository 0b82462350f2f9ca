#!/usr/bin/env bash
# Installs what is missing, then mounts logfs in the foreground with the
# embedded default: data in ./data, mount at ./mnt.  Ctrl-C unmounts cleanly
# (flush, checkpoints, clean-shutdown marker).  Extra arguments go to
# `logfs mount` (e.g. -o num.partitions=3).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
mkdir -p mnt data
if mountpoint -q mnt; then
    echo "run: ./mnt is still mounted (a previous run was killed?); unmounting it first"
    fusermount3 -u mnt || fusermount3 -uz mnt
fi
echo "run: mounting logfs at $PWD/mnt with data in $PWD/data (Ctrl-C to unmount)"
exec .venv/bin/logfs mount mnt --data-dir data "$@"
