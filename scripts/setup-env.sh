#!/usr/bin/env bash
# Prepare this machine for the real tests and the example build. Idempotent: a second run
# changes nothing and takes a few seconds.
#
#   1. Debian packages: docker.io, debootstrap, docker-registry, apache2-utils (apt, only if missing)
#   2. .venv with `pip install -e '.[test]'` (redone only when pyproject.toml changes)
#   3. a Docker engine answering on unix:///var/run/docker.sock (started in the background if not)
#   4. the stand-in base image python:3.13-slim-trixie (debootstrap trixie + docker import; the
#      rootfs tarball is cached under /var/cache/build-sandbox-image)
#   5. a local registry with htpasswd auth on 127.0.0.1:5000
#   then writes .test-env.json (repo root, git-ignored) for the tests to read.
#
# Usage: scripts/setup-env.sh [--venv-only]      (run as root; CI runs it through `make test`)
# Environment overrides (for testing this script itself):
#   BSI_STANDIN_IMAGE    tag of the stand-in image        (default python:3.13-slim-trixie)
#   BSI_CACHE_DIR        stand-in rootfs tarball cache    (default /var/cache/build-sandbox-image)
#   BSI_REFRESH_STANDIN  1 = re-import the stand-in even if an image with that tag exists
#   BSI_TEST_ENV         where to write the test-env file (default <repo>/.test-env.json)
#   PYTHON               interpreter for the venv         (default python3, must be >= 3.11)
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"

DOCKER=/usr/bin/docker # Debian's 20.10 CLI; a newer one earlier on PATH may demand buildx
DOCKER_SOCK=unix:///var/run/docker.sock
export DOCKER_HOST="$DOCKER_SOCK" DOCKER_BUILDKIT=1

APT_PACKAGES=(docker.io debootstrap docker-registry apache2-utils curl)

VENV="$REPO_ROOT/.venv"
PYTHON="${PYTHON:-python3}"

STANDIN_IMAGE="${BSI_STANDIN_IMAGE:-python:3.13-slim-trixie}"
# Bump STANDIN_VERSION whenever the recipe in build_standin_rootfs changes: the cache key and the
# image label follow it, so every machine rebuilds its stand-in once.
STANDIN_VERSION="trixie-minbase-1"
STANDIN_LABEL="org.build-sandbox-image.standin"
STANDIN_MIRROR="http://deb.debian.org/debian"
CACHE_DIR="${BSI_CACHE_DIR:-/var/cache/build-sandbox-image}"

REGISTRY_HOST=127.0.0.1
REGISTRY_PORT=5000
REGISTRY_ADDR="$REGISTRY_HOST:$REGISTRY_PORT"
REGISTRY_USER=bsi
REGISTRY_PASSWORD=bsi-test-password
REGISTRY_DIR=/var/lib/build-sandbox-image-registry

STATE_LOG_DIR=/var/log/build-sandbox-image
TEST_ENV_FILE="${BSI_TEST_ENV:-$REPO_ROOT/.test-env.json}"

export DEBIAN_FRONTEND=noninteractive

say() { printf 'setup-env: %s\n' "$*"; }
die() {
	printf 'setup-env: ERROR: %s\n' "$*" >&2
	exit 1
}

need_root() {
	[[ ${EUID:-$(id -u)} -eq 0 ]] || die "must run as root (needed for: $1)"
}

# ---------------------------------------------------------------------------------------------
# 1. Debian packages
# ---------------------------------------------------------------------------------------------
apt_installed() {
	[[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" == "install ok installed" ]]
}

apt_ensure() {
	local missing=() pkg
	for pkg in "$@"; do
		apt_installed "$pkg" || missing+=("$pkg")
	done
	if ((${#missing[@]} == 0)); then
		return 0
	fi
	need_root "apt-get install ${missing[*]}"
	say "installing Debian packages: ${missing[*]}"
	apt-get update -qq
	apt-get install -y -qq "${missing[@]}" >/dev/null
}

step_packages() {
	apt_ensure "${APT_PACKAGES[@]}"
	say "packages: ok (${APT_PACKAGES[*]})"
}

# ---------------------------------------------------------------------------------------------
# 2. virtualenv
# ---------------------------------------------------------------------------------------------
step_venv() {
	command -v "$PYTHON" >/dev/null || die "$PYTHON not found"
	"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
		die "$PYTHON is $("$PYTHON" -V 2>&1); need >= 3.11"
	if ! "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null; then
		apt_ensure python3-venv
	fi

	if [[ ! -x "$VENV/bin/python" ]] || ! "$VENV/bin/python" -c 'import sys' 2>/dev/null; then
		say "creating $VENV with $("$PYTHON" -V 2>&1)"
		rm -rf "$VENV"
		"$PYTHON" -m venv "$VENV"
	fi

	local stamp="$VENV/.bsi-install-stamp" want
	want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
	if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" && -x "$VENV/bin/build-sandbox-image" ]]; then
		say "venv: up to date ($VENV)"
		return 0
	fi
	say "venv: pip install -e '.[test]'"
	rm -f "$stamp"
	"$VENV/bin/python" -m pip install -q -e '.[test]'
	printf '%s\n' "$want" >"$stamp"
	say "venv: installed"
}

# ---------------------------------------------------------------------------------------------
# 3. Docker engine
# ---------------------------------------------------------------------------------------------
engine_answers() {
	timeout 10 "$DOCKER" info >/dev/null 2>&1
}

step_engine() {
	if engine_answers; then
		say "engine: answering ($("$DOCKER" version --format '{{.Server.Version}}' 2>/dev/null))"
		return 0
	fi
	need_root "starting dockerd"
	mkdir -p "$STATE_LOG_DIR"
	local log="$STATE_LOG_DIR/dockerd.log"
	say "engine: starting dockerd (log: $log)"
	# setsid: keep it out of this shell's process group, so ^C on `make test` does not stop it.
	setsid /usr/sbin/dockerd --host "$DOCKER_SOCK" >>"$log" 2>&1 </dev/null &
	local pid=$! i
	for ((i = 0; i < 60; i++)); do
		if engine_answers; then
			say "engine: answering after ${i}s (dockerd pid $pid)"
			return 0
		fi
		kill -0 "$pid" 2>/dev/null || {
			tail -n 20 "$log" >&2
			die "dockerd exited; see $log"
		}
		sleep 1
	done
	tail -n 20 "$log" >&2
	die "dockerd did not answer within 60 s; see $log"
}

# ---------------------------------------------------------------------------------------------
# 4. Stand-in for python:3.13-slim-trixie (no registry can be reached to pull the real one)
# ---------------------------------------------------------------------------------------------
# Debian 13 minbase with Debian's python3 (3.13), pip and ca-certificates, tidied like the official
# slim images: apt lists and caches removed, the docker-* apt/dpkg configs of debian:*-slim, and no
# EXTERNALLY-MANAGED marker (the official image's pip installs freely).
build_standin_rootfs() {
	local rootfs="$1"
	debootstrap --variant=minbase --include=python3,python3-pip,ca-certificates \
		trixie "$rootfs" "$STANDIN_MIRROR" >"$STATE_LOG_DIR/debootstrap.log" 2>&1 || {
		tail -n 20 "$STATE_LOG_DIR/debootstrap.log" >&2
		die "debootstrap failed; see $STATE_LOG_DIR/debootstrap.log"
	}
	cat >"$rootfs/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
	printf 'Acquire::Languages "none";\n' >"$rootfs/etc/apt/apt.conf.d/docker-no-languages"
	printf 'Acquire::GzipIndexes "true";\n' >"$rootfs/etc/apt/apt.conf.d/docker-gzip-indexes"
	printf 'Apt::AutoRemove::SuggestsImportant "false";\n' \
		>"$rootfs/etc/apt/apt.conf.d/docker-autoremove-suggests"
	rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin \
		"$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/log/apt/* "$rootfs"/var/log/dpkg.log \
		"$rootfs"/var/cache/debconf/*-old "$rootfs"/var/lib/dpkg/*-old
	rm -f "$rootfs"/usr/lib/python3*/EXTERNALLY-MANAGED
	mkdir -p "$rootfs/var/lib/apt/lists/partial"
}

standin_label() {
	"$DOCKER" image inspect --format "{{ index .Config.Labels \"$STANDIN_LABEL\" }}" \
		"$STANDIN_IMAGE" 2>/dev/null
}

step_standin() {
	local have
	if "$DOCKER" image inspect "$STANDIN_IMAGE" >/dev/null 2>&1; then
		have="$(standin_label || true)"
		if [[ "$have" == "$STANDIN_VERSION" && "${BSI_REFRESH_STANDIN:-0}" != 1 ]]; then
			say "stand-in: $STANDIN_IMAGE present ($STANDIN_VERSION)"
			return 0
		fi
		if [[ ( -z "$have" || "$have" == "<no value>" ) && "${BSI_REFRESH_STANDIN:-0}" != 1 ]]; then
			# Made by hand or pulled for real: not ours to replace.
			say "stand-in: $STANDIN_IMAGE present (not made by this script; kept;" \
				"BSI_REFRESH_STANDIN=1 replaces it)"
			return 0
		fi
		say "stand-in: $STANDIN_IMAGE is ${have:-unlabelled}, want $STANDIN_VERSION: re-importing"
	fi
	need_root "building the stand-in base image"
	mkdir -p "$CACHE_DIR" "$STATE_LOG_DIR"
	local tarball="$CACHE_DIR/standin-$STANDIN_VERSION.tar.gz"
	if [[ ! -s "$tarball" ]]; then
		local work
		work="$(mktemp -d "$CACHE_DIR/build.XXXXXX")"
		# shellcheck disable=SC2064  # expand $work now
		trap "rm -rf '$work'" EXIT
		say "stand-in: debootstrap trixie (about 40 s)"
		build_standin_rootfs "$work/rootfs"
		local gz=gzip
		command -v pigz >/dev/null && gz=pigz
		tar -C "$work/rootfs" --numeric-owner -c . | "$gz" -1 >"$work/rootfs.tar.gz"
		mv "$work/rootfs.tar.gz" "$tarball"
		rm -rf "$work"
		trap - EXIT
		# Drop tarballs of older recipes.
		find "$CACHE_DIR" -maxdepth 1 -name 'standin-*.tar.gz' ! -name "${tarball##*/}" -delete
		say "stand-in: cached $tarball ($(du -h "$tarball" | cut -f1))"
	else
		say "stand-in: using cached $tarball"
	fi
	"$DOCKER" import \
		-c 'CMD ["python3"]' \
		-c 'ENV LANG=C.UTF-8' \
		-c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
		-c "LABEL $STANDIN_LABEL=$STANDIN_VERSION" \
		"$tarball" "$STANDIN_IMAGE" >/dev/null
	local probe='import platform; print("Python", platform.python_version(), platform.libc_ver())'
	say "stand-in: imported $STANDIN_IMAGE:" \
		"$("$DOCKER" run --rm --network none "$STANDIN_IMAGE" python3 -c "$probe")"
}

# ---------------------------------------------------------------------------------------------
# 5. Local registry (distribution 2.8) with htpasswd auth, loopback only
# ---------------------------------------------------------------------------------------------
# HTTP status of GET /v2/ (000 when nothing answers); with "auth" it sends the test credentials.
registry_status() {
	local args=(-s -o /dev/null -w '%{http_code}' --max-time 3 --noproxy '*')
	[[ "${1:-}" == auth ]] && args+=(-u "$REGISTRY_USER:$REGISTRY_PASSWORD")
	curl "${args[@]}" "http://$REGISTRY_ADDR/v2/" 2>/dev/null || true
}

registry_ready() {
	[[ "$(registry_status)" == 401 && "$(registry_status auth)" == 200 ]]
}

write_registry_config() {
	mkdir -p "$REGISTRY_DIR/storage"
	if ! htpasswd -vb "$REGISTRY_DIR/htpasswd" "$REGISTRY_USER" "$REGISTRY_PASSWORD" \
		>/dev/null 2>&1; then
		htpasswd -Bbn "$REGISTRY_USER" "$REGISTRY_PASSWORD" >"$REGISTRY_DIR/htpasswd.tmp"
		mv "$REGISTRY_DIR/htpasswd.tmp" "$REGISTRY_DIR/htpasswd"
	fi
	cat >"$REGISTRY_DIR/config.yml" <<EOF
# Written by build-sandbox-image scripts/setup-env.sh: test registry, loopback only.
version: 0.1
log:
  level: warn
  fields:
    service: registry
storage:
  filesystem:
    rootdirectory: $REGISTRY_DIR/storage
  delete:
    enabled: true
http:
  addr: $REGISTRY_ADDR
  headers:
    X-Content-Type-Options: [nosniff]
auth:
  htpasswd:
    realm: build-sandbox-image-test
    path: $REGISTRY_DIR/htpasswd
EOF
}

step_registry() {
	local status
	status="$(registry_status)"
	if [[ "$status" != 000 ]]; then
		registry_ready ||
			die "something answers on $REGISTRY_ADDR but is not the test registry" \
				"(GET /v2/: $status unauthenticated, $(registry_status auth) with the test credentials)"
		say "registry: answering on $REGISTRY_ADDR"
		return 0
	fi
	need_root "starting the test registry"
	mkdir -p "$STATE_LOG_DIR"
	write_registry_config
	local log="$STATE_LOG_DIR/registry.log"
	say "registry: starting docker-registry on $REGISTRY_ADDR (log: $log)"
	setsid /usr/bin/docker-registry serve "$REGISTRY_DIR/config.yml" >>"$log" 2>&1 </dev/null &
	local pid=$! i
	for ((i = 0; i < 50; i++)); do
		if registry_ready; then
			say "registry: answering (pid $pid)"
			return 0
		fi
		kill -0 "$pid" 2>/dev/null || {
			tail -n 20 "$log" >&2
			die "docker-registry exited; see $log"
		}
		sleep 0.2
	done
	tail -n 20 "$log" >&2
	die "docker-registry did not answer within 10 s; see $log"
}

# ---------------------------------------------------------------------------------------------
# test-env file
# ---------------------------------------------------------------------------------------------
write_test_env() {
	mkdir -p "$(dirname "$TEST_ENV_FILE")"
	local tmp="$TEST_ENV_FILE.tmp.$$"
	cat >"$tmp" <<EOF
{
  "docker": "$DOCKER",
  "docker_host": "$DOCKER_SOCK",
  "base_image": "$STANDIN_IMAGE",
  "registry": "$REGISTRY_ADDR",
  "registry_user": "$REGISTRY_USER",
  "registry_password": "$REGISTRY_PASSWORD",
  "ca_bundle": "/etc/ssl/certs/ca-certificates.crt"
}
EOF
	mv "$tmp" "$TEST_ENV_FILE"
	say "test env: $TEST_ENV_FILE"
}

main() {
	local start=$SECONDS
	if [[ "${1:-}" == --venv-only ]]; then
		step_venv
		return 0
	fi
	step_packages
	step_venv
	step_engine
	step_standin
	step_registry
	write_test_env
	say "ready in $((SECONDS - start)) s"
}

main "$@"
