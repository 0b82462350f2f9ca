#!/usr/bin/env bash
# Installs whatever is missing for logfs on a fresh Debian machine: the FUSE 3
# library and headers pyfuse3 builds against, a Java runtime for Spark, and the
# Python packages in .venv.  What only the tests need (Apache Kafka's jars) is
# scripts/setup-kafka.sh, which scripts/test.sh runs too.  Safe to run again:
# each step is skipped when done.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v fusermount3 >/dev/null 2>&1 || need_apt+=(fuse3)
pkg-config --exists fuse3 2>/dev/null || need_apt+=(libfuse3-dev)
command -v pkg-config >/dev/null 2>&1 || need_apt+=(pkg-config)
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
command -v mountpoint >/dev/null 2>&1 || need_apt+=(util-linux)
command -v rsync >/dev/null 2>&1 || need_apt+=(rsync)      # the conformance tests run the everyday tools
command -v less >/dev/null 2>&1 || need_apt+=(less)
command -v vim >/dev/null 2>&1 || need_apt+=(vim)          # tests/mount/test_mount_everyday.py saves with vim
command -v emacs >/dev/null 2>&1 || need_apt+=(emacs-nox)  # tests/mount/test_mount_refusals.py saves with emacs
PY=${PYTHON:-python3}
command -v gcc >/dev/null 2>&1 || need_apt+=(gcc)          # the record kernels' C extension, and its headers:
"$PY" -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(sysconfig.get_paths()["include"] + "/Python.h"))' \
    || need_apt+=(python3-dev)
source scripts/apt-install.sh
apt_install "${need_apt[@]}"

if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv"
    "$PY" -m venv .venv
fi
stamp=.venv/.logfs-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ engine/records/_kernels.c -nt "$stamp" ]; then
    echo "setup: installing Python packages into .venv"
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -e ".[test,spark]"
    # (pip builds the record kernels' C extension, engine/records/_kernels.c, with the system compiler)
    touch "$stamp"
fi
# The bytecode of the project's own modules, written now: a Python told not to write it
# (PYTHONDONTWRITEBYTECODE, set on some machines and CI runners) still reads it, and without it every
# `logfs mount` compiled engine/ and logfs/ again at start (half of its 1.0 s here). Up-to-date files
# are skipped, so this costs well under a second once done.
.venv/bin/python -m compileall -q -j 0 engine logfs tests scripts >/dev/null
