#!/usr/bin/env bash
# Sets up everything megapilot and its tests need on a fresh Debian machine:
#   - Debian packages listed in scripts/apt-packages.txt (when run as root and any is missing),
#   - a virtual environment in .venv with megapilot installed editable, with the trainer
#     (torch CPU wheel + megatron-core) and test extras.
# Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3

install_debian_packages() {
  local wanted missing=()
  wanted=$(grep -vE '^\s*(#|$)' scripts/apt-packages.txt || true)
  for pkg in $wanted; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    echo "setup: missing Debian packages (${missing[*]}); install them as root" >&2
    return 0
  fi
  echo "setup: installing Debian packages: ${missing[*]}"
  apt-get update -qq
  without_service_starts apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# Package scripts (slurmctld, slurmd, munge) try to start their daemons; the tests start their own.
# A policy-rc.d that exits 101 tells invoke-rc.d "not now". An existing one (as in Docker images) is kept.
without_service_starts() {
  local policy=/usr/sbin/policy-rc.d created=0 rc=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && created=1
  fi
  DEBIAN_FRONTEND=noninteractive "$@" || rc=$?
  [ "$created" -eq 1 ] && rm -f "$policy"
  return "$rc"
}

install_python_env() {
  [ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
  local stamp=.venv/.megapilot-installed
  if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    .venv/bin/pip install -q --upgrade pip >/dev/null
    .venv/bin/pip install -q -e '.[train,test]'
    touch "$stamp"
  elif scanner_stale; then
    echo "setup: rebuilding the compiled log scanner (megapilot/logs/_scan.c changed)"
    .venv/bin/pip install -q --no-deps -e .
  fi
}

# The compiled log scanner (megapilot/logs/_scan.c) is built in place by the editable install; a checkout whose C
# source is newer than the built module (or that has none, where a C compiler exists) needs it built again.
scanner_stale() {
  local built
  built=$(ls megapilot/logs/_scan*.so 2>/dev/null | head -n 1 || true)
  if [ -z "$built" ]; then
    command -v "${CC:-cc}" >/dev/null 2>&1
    return
  fi
  [ megapilot/logs/_scan.c -nt "$built" ]
}

install_debian_packages
install_python_env
echo "setup: ready (.venv/bin/megapilot)"
