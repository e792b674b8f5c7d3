#!/usr/bin/env bash
# `make test-fast`: the tests that request no part of the machine (the `fast` marker that
# tests/conftest.py sets), run where none of it can be reached: as root, in a network namespace
# of their own (loopback only: no package index, no registry) with the engine's socket covered
# and no test-env file. A test that touches the engine, the registry or the network without
# requesting its fixture then fails here instead of passing by luck.
#
# Usage: scripts/test-fast.sh [PYTEST_ARGS...]      (needs only .venv: make venv)
#   BSI_VENV   the venv whose pytest runs them (default .venv; `make test-oldest`: .venv-oldest)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# One worker per core (pytest-xdist): these tests are CPU-bound and independent.
pytest=("${BSI_VENV:-.venv}/bin/pytest" -q -ra -m fast -p no:cacheprovider -n auto "$@")
export BSI_TEST_ENV=/nonexistent/.test-env.json

isolated() {
	ip link set lo up
	local socket
	for socket in /run/docker.sock /var/run/docker.sock; do
		if [[ -S "$socket" ]]; then mount --bind /dev/null "$socket"; fi
	done
	unset DOCKER_HOST
	exec "$@"
}

if [[ ${EUID:-$(id -u)} -eq 0 ]] && unshare --net --mount true 2>/dev/null; then
	export -f isolated
	exec unshare --net --mount -- bash -c 'isolated "$@"' isolated "${pytest[@]}"
fi
echo "test-fast: not root (or no unshare): running without the network namespace" >&2
exec "${pytest[@]}"
