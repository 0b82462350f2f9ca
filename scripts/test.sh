#!/usr/bin/env bash
# Installs what is missing, runs the linters (ruff, mypy, configured in
# pyproject.toml), then the whole test suite (real FUSE mounts included) on parallel workers.
# Exits non-zero on any failure: a linter finding (after both linters ran, so
# one run shows every finding), a failed test, and also when pytest collects no
# tests at all (its exit code 5).
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test && bash scripts/setup-kafka.sh || exit 1

lint_failed=()
.venv/bin/ruff check . || lint_failed+=(ruff)
.venv/bin/mypy || lint_failed+=(mypy)
if [ "${#lint_failed[@]}" -gt 0 ]; then
    echo "test: lint failed: ${lint_failed[*]} (see its findings above); the tests were not run" >&2
    exit 1
fi

# One worker a core (pytest-xdist); a group of tests (tests/markers.py: the cluster and Spark tests, each module
# with its own broker) runs on one worker. LOGFS_TEST_WORKERS=0 runs in this process alone.
# No test reads this shell's input (an editor or a pager would wait on a terminal or an open pipe forever).
# A test stuck past its timeout leaves its threads' stacks in LOGFS_TEST_HANG_DIR (tests/watchdog.py), shown
# below; the whole run stops (SIGINT: pytest still reports) after LOGFS_TEST_LIMIT seconds, under CI's 90 minutes.
hang_dir=$(mktemp -d "${TMPDIR:-/tmp}/logfs-hangs.XXXXXX")
LOGFS_TEST_HANG_DIR=$hang_dir timeout --signal=INT --kill-after=120 "${LOGFS_TEST_LIMIT:-4800}" \
    .venv/bin/python -m pytest -q -n "${LOGFS_TEST_WORKERS:-auto}" --dist loadgroup \
    --durations=25 tests "$@" </dev/null   # the 25 slowest, to keep the suite short
status=$?
for hang in "$hang_dir"/*; do
    [ -e "$hang" ] || continue
    echo "test: the watchdog (tests/watchdog.py) caught a stuck test process (${hang##*/}):" >&2
    cat "$hang" >&2
done
rm -rf "$hang_dir"
if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
    echo "test: the run passed LOGFS_TEST_LIMIT (${LOGFS_TEST_LIMIT:-4800} s) and was stopped" >&2
fi
if [ "$status" -eq 5 ]; then
    echo "test: pytest collected no tests" >&2
    exit 1
fi
exit "$status"
