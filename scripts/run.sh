#!/usr/bin/env bash
# Installs what mounting needs and is missing (scripts/setup.sh: FUSE, gcc and
# the mount's Python packages; nothing only the tests use), then mounts logfs in the foreground with the
# embedded default: data in ./data, mount at ./mnt.  Ctrl-C unmounts cleanly
# (flush, checkpoints, clean-shutdown marker).  Extra arguments go to
# `logfs mount` (e.g. -o num.partitions=3).
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
    cat <<'EOF'
usage: scripts/run.sh [LOGFS MOUNT OPTIONS ...]

Installs what a mount needs and is missing (scripts/setup.sh), then serves logfs in the
foreground at ./mnt with its data in ./data until Ctrl-C (or `logfs umount mnt`
from another shell), which shuts it down cleanly.  Arguments go to
`logfs mount mnt --data-dir data`, for example:

  scripts/run.sh -o num.partitions=3 -o log.retention.hours=1
  scripts/run.sh --read-only
  scripts/run.sh --bootstrap-server broker1:9092,broker2:9092   # a Kafka cluster,
                                              # its local replica in ./data-cluster

A mount left behind by a logfs that was killed (kill -9: "Transport endpoint
is not connected") is detached first.  A mount served by a running logfs is
left alone: unmount it first.
EOF
    if [ -x .venv/bin/logfs ]; then
        echo
        .venv/bin/logfs mount --help
    fi
}

for arg in "$@"; do
    case "$arg" in
        -h|--help) usage; exit 0 ;;
    esac
done

bash scripts/setup.sh

# A FUSE mount whose process died answers every stat with ENOTCONN, so check
# /proc/self/mountinfo (which needs no stat) before touching ./mnt.
mnt="$PWD/mnt"
if awk -v m="$mnt" '$5 == m { found = 1 } END { exit !found }' /proc/self/mountinfo; then
    if stat -- "$mnt" >/dev/null 2>&1; then
        echo "run: $mnt is already mounted by a running logfs; unmount it first (.venv/bin/logfs umount mnt)" >&2
        exit 1
    fi
    echo "run: $mnt is a stale mount of a logfs that was killed; detaching it"
    fusermount3 -uz "$mnt"
fi
# With --bootstrap-server the mount serves a Kafka cluster; its local replica
# lives in ./data-cluster (an embedded ./data is never mixed with a replica).
data=data
for arg in "$@"; do
    case "$arg" in
        --bootstrap-server|--bootstrap-server=*) data=data-cluster ;;
    esac
done
mkdir -p mnt "$data"
echo "run: mounting logfs at $mnt with data in $PWD/$data (Ctrl-C to unmount)"
exec .venv/bin/logfs mount mnt --data-dir "$data" "$@"
