#!/usr/bin/env bash
# Installs whatever is missing for logfs on a fresh Debian machine, each step
# skipped when done (safe to run again).
#
#   scripts/setup.sh          what mounting needs (scripts/run.sh): the FUSE 3
#                             library and headers pyfuse3 builds against, gcc
#                             and Python's headers for the record kernels' C
#                             extension, and the mount's Python packages in .venv
#   scripts/setup.sh --test   that, and what only the tests and Spark use
#                             (scripts/test.sh): the everyday tools the
#                             conformance tests drive (rsync, less, vim, emacs),
#                             a Java runtime for Spark, and the test and spark
#                             extras. Apache Kafka's jars are scripts/setup-kafka.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

test_tools=false
case "${1:-}" in
    --test) test_tools=true ;;
    "") ;;
    *) echo "usage: scripts/setup.sh [--test]" >&2; exit 2 ;;
esac

need_apt=()
command -v fusermount3 >/dev/null 2>&1 || need_apt+=(fuse3)
pkg-config --exists fuse3 2>/dev/null || need_apt+=(libfuse3-dev)
command -v pkg-config >/dev/null 2>&1 || need_apt+=(pkg-config)
PY=${PYTHON:-python3}
command -v gcc >/dev/null 2>&1 || need_apt+=(gcc)          # the record kernels' C extension, and its headers:
"$PY" -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(sysconfig.get_paths()["include"] + "/Python.h"))' \
    || need_apt+=(python3-dev)
"$PY" -c 'import ensurepip' 2>/dev/null || need_apt+=(python3-venv)
if $test_tools; then
    command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)    # Spark
    command -v mountpoint >/dev/null 2>&1 || need_apt+=(util-linux)
    command -v rsync >/dev/null 2>&1 || need_apt+=(rsync)      # the conformance tests run the everyday tools
    command -v less >/dev/null 2>&1 || need_apt+=(less)
    command -v vim >/dev/null 2>&1 || need_apt+=(vim)          # tests/mount/test_mount_everyday.py saves with vim
    command -v emacs >/dev/null 2>&1 || need_apt+=(emacs-nox)  # tests/mount/test_mount_refusals.py saves with emacs
fi
source scripts/apt-install.sh
apt_install "${need_apt[@]}"

if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv"
    "$PY" -m venv .venv
fi
# An editable install (the work tree is the package). setuptools warns at every editable install (in each
# mode: "Editable installation. Please be careful with folders in your working directory with the same
# name as your package"), which pip prints as a BuildBackendWarning: that one message is not shown.
pip_install() {
    PYTHONWARNINGS="ignore:Editable installation" .venv/bin/python -m pip install -q -e "$1"
}
stamp=.venv/.logfs-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ engine/records/_kernels.c -nt "$stamp" ]; then
    echo "setup: installing the mount's Python packages into .venv"
    .venv/bin/python -m pip install -q --upgrade pip
    pip_install .
    # (pip builds the record kernels' C extension, engine/records/_kernels.c, with the system compiler)
    touch "$stamp"
fi
test_stamp=.venv/.logfs-test-installed
if $test_tools && { [ ! -f "$test_stamp" ] || [ pyproject.toml -nt "$test_stamp" ]; }; then
    echo "setup: installing the test and spark extras into .venv"
    pip_install ".[test,spark]"
    touch "$test_stamp"
fi
# The bytecode of the project's own modules, written now: a Python told not to write it
# (PYTHONDONTWRITEBYTECODE, set on some machines and CI runners) still reads it, and without it every
# `logfs mount` compiled engine/ and logfs/ again at start (half of its 1.0 s here). Up-to-date files
# are skipped, so this costs well under a second once done.
.venv/bin/python -m compileall -q -j 0 engine logfs tests scripts >/dev/null
