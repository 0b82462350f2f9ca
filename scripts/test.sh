#!/usr/bin/env bash
# Installs what is missing, then runs the whole test suite (real FUSE mounts
# included).  Exits non-zero on any failure, and also when pytest collects no
# tests at all (its exit code 5).
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh && bash scripts/setup-kafka.sh || exit 1
.venv/bin/python -m pytest -q tests "$@"
status=$?
if [ "$status" -eq 5 ]; then
    echo "test: pytest collected no tests" >&2
    exit 1
fi
exit "$status"
