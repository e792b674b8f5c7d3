#!/usr/bin/env bash
# Prepare this machine for the real tests and the example build. Idempotent: a second run
# changes nothing and takes a few seconds.
#
#   1. Debian packages: docker.io, debootstrap, mmdebstrap, docker-registry, apache2-utils, curl,
#      openssh-server (for the ssh:// engine test's own sshd; never started as a service)
#      (apt, only if missing)
#   2. .venv with `pip install -e '.[test]'` (redone only when pyproject.toml changes)
#   3. a Docker engine answering on unix:///var/run/docker.sock (started in the background if not)
#   4. arm64 emulation: binfmt_misc mounted, Debian's qemu-user-static registered for aarch64 with
#      the F (fix-binary) flag, so the engine runs arm64 containers and arm64 RUN steps
#   5. the stand-in base image python:3.13-slim-trixie for amd64 (debootstrap + docker import) and
#      its arm64 twin python:3.13-slim-trixie-arm64 (mmdebstrap under emulation + a FROM scratch
#      build); both rootfs tarballs are cached under /var/cache/build-sandbox-image
#   6. a local registry with htpasswd auth on 127.0.0.1:5000
#   7. the two stand-ins pushed there by digest under one image index,
#      127.0.0.1:5000/library/python:3.13-slim-trixie (skipped when it already names both)
#   8. Debian 13's cosign (the signature tests' verifier): `apt-get download` against a private
#      trixie source list and lists directory (the machine's apt set-up is untouched), the binary
#      extracted with dpkg-deb -x and cached under the cache directory
#   9. Debian 13's soci-snapshotter 0.4.1 (the `soci` CLI and `soci-snapshotter-grpc`), the SOCI
#      tests' lazy node, fetched the same way
#   then writes .test-env.json (repo root, git-ignored) for the tests to read.
#
# Usage: scripts/setup-env.sh [--all | --example | --venv-only]   (run as root)
#   --all (default)  every step: what the whole test suite needs (`make test`, CI); when the
#                    arm64 stand-in is missing, steps 5 (arm64) and 7 run in the background
#                    (--arm64), and the tests that need them wait for it
#   --example        steps 1-3 and the amd64 stand-in only: what `make example` needs
#   --arm64          emulation, the arm64 stand-in, the registry and step 7, under a lock
#   --venv-only      step 2 only (`make lint`, `make test-fast`)
# Environment overrides (for testing this script itself):
#   BSI_STANDIN_IMAGE    tag of the stand-in image        (default python:3.13-slim-trixie;
#                        the arm64 one is tagged <it>-arm64; the index is <registry>/library/<it>)
#   BSI_CACHE_DIR        stand-in rootfs tarball cache    (default /var/cache/build-sandbox-image)
#   BSI_REFRESH_STANDIN  1 = re-import the stand-ins even if images with those tags exist
#   BSI_TEST_ENV         where to write the test-env file (default <repo>/.test-env.json)
#   PYTHON               interpreter for the venv         (default python3, must be >= 3.11;
#                        /usr/bin/python3 is installed with apt when missing)
#   BSI_VENV             where the venv goes              (default <repo>/.venv; `make test-oldest`
#                        makes .venv-oldest from Debian's python3)
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"

DOCKER=/usr/bin/docker # Debian's 20.10 CLI; a newer one earlier on PATH may demand buildx
DOCKER_SOCK=unix:///var/run/docker.sock
export DOCKER_HOST="$DOCKER_SOCK" DOCKER_BUILDKIT=1

APT_PACKAGES=(docker.io debootstrap docker-registry apache2-utils curl)
# Without recommends (libpam-systemd would bring systemd): its sshd serves only the ssh:// engine
# test (tests/sshengine.py starts its own on a free port), never as a service.
SSH_PACKAGES=(openssh-server)
# Installed without recommends: qemu-user-static's (systemd | binfmt-support) would register
# handlers of their own, and mmdebstrap's are not needed in root mode.
EMULATION_PACKAGES=(qemu-user-static mmdebstrap)

VENV="${BSI_VENV:-$REPO_ROOT/.venv}"
PYTHON="${PYTHON:-python3}"

STANDIN_IMAGE="${BSI_STANDIN_IMAGE:-python:3.13-slim-trixie}"
# Bump STANDIN_VERSION whenever the recipe in build_standin_rootfs changes: the cache key and the
# image label follow it, so every machine rebuilds its stand-in once.
STANDIN_VERSION="trixie-minbase-1"
STANDIN_ARM64_IMAGE="$STANDIN_IMAGE-arm64"
STANDIN_ARM64_VERSION="trixie-minbase-arm64-1"
STANDIN_LABEL="org.build-sandbox-image.standin"
STANDIN_MIRROR="http://deb.debian.org/debian"
CACHE_DIR="${BSI_CACHE_DIR:-/var/cache/build-sandbox-image}"

REGISTRY_HOST=127.0.0.1
REGISTRY_PORT=5000
REGISTRY_ADDR="$REGISTRY_HOST:$REGISTRY_PORT"
REGISTRY_USER=bsi
REGISTRY_PASSWORD=bsi-test-password
REGISTRY_DIR=/var/lib/build-sandbox-image-registry

# The two-arch index: <registry>/library/python:3.13-slim-trixie; each arch also tagged -<arch>.
MULTIARCH_NAME="${STANDIN_IMAGE%%:*}"
[[ "$MULTIARCH_NAME" == */* ]] || MULTIARCH_NAME="library/$MULTIARCH_NAME"
MULTIARCH_TAG="${STANDIN_IMAGE##*:}"
MULTIARCH_REPO="$REGISTRY_ADDR/$MULTIARCH_NAME"
MULTIARCH_BASE="$MULTIARCH_REPO:$MULTIARCH_TAG"

BINFMT_DIR=/proc/sys/fs/binfmt_misc
# Debian's registration line for aarch64 (magic, mask, interpreter, flags); F is added if missing.
QEMU_AARCH64_CONF=/usr/lib/binfmt.d/qemu-aarch64.conf
# How binfmt_misc shows an aarch64 ELF magic: ELF64, little-endian, e_machine 183 (EM_AARCH64).
AARCH64_MAGIC=7f454c460201010000000000000000000200b700

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

# apt_ensure [--no-install-recommends] PACKAGE...
apt_ensure() {
	local missing=() opts=() pkg
	if [[ "${1:-}" == --no-install-recommends ]]; then
		opts+=("$1")
		shift
	fi
	for pkg in "$@"; do
		apt_installed "$pkg" || missing+=("$pkg")
	done
	if ((${#missing[@]} == 0)); then
		return 0
	fi
	need_root "apt-get install ${missing[*]}"
	say "installing Debian packages: ${missing[*]}"
	apt-get update -qq
	apt-get install -y -qq "${opts[@]}" "${missing[@]}" >/dev/null
}

step_packages() {
	apt_ensure "${APT_PACKAGES[@]}"
	apt_ensure --no-install-recommends "${SSH_PACKAGES[@]}"
	say "packages: ok (${APT_PACKAGES[*]} ${SSH_PACKAGES[*]})"
}

# ---------------------------------------------------------------------------------------------
# 2. virtualenv
# ---------------------------------------------------------------------------------------------
step_venv() {
	if [[ "$PYTHON" == /usr/bin/python3 && ! -x "$PYTHON" ]]; then
		apt_ensure python3
	fi
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

# A machine stopped without stopping dockerd keeps its pid files in /run. dockerd only asks
# whether *a* process has the recorded pid, so once another process reuses it dockerd refuses to
# start ("pid file found"), and the containerd it supervises would be taken for running (and
# later killed by that pid). A pid file naming no process of the expected name is removed.
remove_stale_pidfile() { # file, command name
	local file="$1" name="$2" pid comm=""
	[[ -f "$file" ]] || return 0
	pid="$(tr -cd '0-9' <"$file")"
	[[ -n "$pid" ]] && comm="$(cat "/proc/$pid/comm" 2>/dev/null || true)"
	# a killed daemon not yet reaped (a zombie) still answers to its pid, and to its name
	[[ -n "$comm" ]] && grep -q '^State:[[:space:]]*Z' "/proc/$pid/status" 2>/dev/null && comm="$comm, a zombie"
	[[ -n "$pid" && "$comm" == "$name" ]] && return 0
	say "engine: removing stale pid file $file (pid ${pid:-none} is ${comm:-not running})"
	rm -f "$file"
}

step_engine() {
	if engine_answers; then
		say "engine: answering ($("$DOCKER" version --format '{{.Server.Version}}' 2>/dev/null))"
		return 0
	fi
	need_root "starting dockerd"
	mkdir -p "$STATE_LOG_DIR"
	remove_stale_pidfile /var/run/docker.pid dockerd
	remove_stale_pidfile /var/run/docker/containerd/containerd.pid containerd
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
# 4. arm64 emulation (binfmt_misc + qemu-user-static, fix-binary)
# ---------------------------------------------------------------------------------------------
# Prints the names of the enabled binfmt_misc entries for aarch64 ELF binaries, one a line,
# each followed by its flags ("qemu-aarch64 POF").
aarch64_handlers() {
	local entry
	for entry in "$BINFMT_DIR"/*; do
		if [[ ! -f "$entry" || "${entry##*/}" == register || "${entry##*/}" == status ]] ||
			! grep -qx "magic $AARCH64_MAGIC" "$entry" || ! grep -qx enabled "$entry"; then
			continue
		fi
		printf '%s %s\n' "${entry##*/}" "$(sed -n 's/^flags: //p' "$entry")"
	done
}

# The engine starts containers in their own mount namespace, where the host's interpreter path
# does not exist: only an F (fix-binary) handler, whose interpreter the kernel opened when it was
# registered, runs arm64 binaries inside containers and BuildKit RUN steps.
step_emulation() {
	if ! mountpoint -q "$BINFMT_DIR"; then
		need_root "mounting binfmt_misc"
		mount -t binfmt_misc binfmt_misc "$BINFMT_DIR" ||
			die "cannot mount binfmt_misc on $BINFMT_DIR (a container without CAP_SYS_ADMIN?)"
		say "emulation: mounted binfmt_misc on $BINFMT_DIR"
	fi
	apt_ensure --no-install-recommends "${EMULATION_PACKAGES[@]}"
	local handlers name flags
	handlers="$(aarch64_handlers)"
	if [[ -n "$handlers" ]] && ! grep -qv ' .*F' <<<"$handlers"; then
		say "emulation: aarch64 registered (${handlers//$'\n'/, })"
		return 0
	fi
	need_root "registering qemu-aarch64-static with binfmt_misc"
	# A handler without F would shadow ours inside containers: replace it.
	while read -r name flags; do
		[[ -n "$name" ]] || continue
		say "emulation: removing aarch64 handler $name (flags '$flags', no F)"
		printf -- '-1' >"$BINFMT_DIR/$name"
	done <<<"$handlers"
	[[ -f "$QEMU_AARCH64_CONF" ]] || die "$QEMU_AARCH64_CONF missing (qemu-user-static installed?)"
	local line
	line="$(grep -v '^#' "$QEMU_AARCH64_CONF" | head -n 1)"
	[[ "${line##*:}" == *F* ]] || line+=F
	printf '%s' "$line" >"$BINFMT_DIR/register" || die "registering $QEMU_AARCH64_CONF failed"
	handlers="$(aarch64_handlers)"
	[[ "$handlers" == *F* ]] || die "aarch64 handler not registered with F after writing $line"
	say "emulation: registered ${handlers//$'\n'/, }"
}

# ---------------------------------------------------------------------------------------------
# 5. Stand-in for python:3.13-slim-trixie (no registry can be reached to pull the real one)
# ---------------------------------------------------------------------------------------------
# Debian 13 minbase with Debian's python3 (3.13), pip and ca-certificates, tidied like the official
# slim images: apt lists and caches removed, the docker-* apt/dpkg configs of debian:*-slim, and no
# EXTERNALLY-MANAGED marker (the official image's pip installs freely).
# build_standin_rootfs ARCH DIR
build_standin_rootfs() {
	local arch="$1" rootfs="$2" log="$STATE_LOG_DIR/rootfs-$1.log"
	local include=python3,python3-pip,ca-certificates
	if [[ "$arch" == amd64 ]]; then
		debootstrap --variant=minbase --include="$include" trixie "$rootfs" "$STANDIN_MIRROR"
	else
		# Under emulation mmdebstrap (apt resolves and installs in one run) takes about 5 min
		# where debootstrap takes about 11 min.
		mmdebstrap --arch="$arch" --variant=minbase --include="$include" \
			trixie "$rootfs" "$STANDIN_MIRROR"
	fi >"$log" 2>&1 || {
		tail -n 20 "$log" >&2
		die "building the $arch rootfs failed; see $log"
	}
	cat >"$rootfs/etc/apt/apt.conf.d/docker-clean" <<'CONF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
CONF
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

# The image config both stand-ins get (the official image's CMD and ENV), as Dockerfile lines.
standin_config() {
	printf '%s\n' 'CMD ["python3"]' 'ENV LANG=C.UTF-8' \
		'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
		"LABEL $STANDIN_LABEL=$1"
}

# load_standin ARCH TARBALL IMAGE VERSION
load_standin() {
	local arch="$1" tarball="$2" image="$3" version="$4" line
	if [[ "$arch" == amd64 ]]; then
		local changes=()
		while IFS= read -r line; do changes+=(-c "$line"); done < <(standin_config "$version")
		"$DOCKER" import "${changes[@]}" "$tarball" "$image" >/dev/null
		return 0
	fi
	# `docker import --platform` leaves the image labelled amd64 on this engine; a FROM scratch
	# build for the target platform labels it right.
	local ctx
	ctx="$(mktemp -d "$CACHE_DIR/context.XXXXXX")"
	ln "$tarball" "$ctx/rootfs.tar.gz"
	{
		printf 'FROM scratch\nADD rootfs.tar.gz /\n'
		standin_config "$version"
	} >"$ctx/Dockerfile"
	"$DOCKER" build -q --platform "linux/$arch" -t "$image" "$ctx" >/dev/null || {
		rm -rf "$ctx"
		die "docker build of the $arch stand-in $image failed"
	}
	rm -rf "$ctx"
}

standin_label() {
	"$DOCKER" image inspect --format "{{ index .Config.Labels \"$STANDIN_LABEL\" }}" "$1" \
		2>/dev/null
}

# ensure_standin ARCH IMAGE VERSION: IMAGE holds the stand-in rootfs for ARCH, recipe VERSION.
ensure_standin() {
	local arch="$1" image="$2" version="$3" have
	if "$DOCKER" image inspect "$image" >/dev/null 2>&1; then
		have="$(standin_label "$image" || true)"
		if [[ "$have" == "$version" && "${BSI_REFRESH_STANDIN:-0}" != 1 ]]; then
			say "stand-in: $image present ($version)"
			return 0
		fi
		if [[ (-z "$have" || "$have" == "<no value>") && "${BSI_REFRESH_STANDIN:-0}" != 1 ]]; then
			# Made by hand or pulled for real: not ours to replace.
			say "stand-in: $image present (not made by this script; kept;" \
				"BSI_REFRESH_STANDIN=1 replaces it)"
			return 0
		fi
		say "stand-in: $image is ${have:-unlabelled}, want $version: re-importing"
	fi
	need_root "building the stand-in base image $image"
	mkdir -p "$CACHE_DIR" "$STATE_LOG_DIR"
	local tarball="$CACHE_DIR/standin-$arch-$version.tar.gz"
	if [[ ! -s "$tarball" ]]; then
		local work start=$SECONDS eta="about 1 min"
		[[ "$arch" == amd64 ]] || eta="about 5 min under emulation"
		work="$(mktemp -d "$CACHE_DIR/build.XXXXXX")"
		# shellcheck disable=SC2064  # expand $work now
		trap "rm -rf '$work'" EXIT
		say "stand-in: building the trixie $arch rootfs ($eta)"
		build_standin_rootfs "$arch" "$work/rootfs"
		local gz=gzip
		command -v pigz >/dev/null && gz=pigz
		tar -C "$work/rootfs" --numeric-owner -c . | "$gz" -1 >"$work/rootfs.tar.gz"
		mv "$work/rootfs.tar.gz" "$tarball"
		rm -rf "$work"
		trap - EXIT
		# Drop this arch's tarballs of older recipes.
		find "$CACHE_DIR" -maxdepth 1 -name "standin-$arch-*.tar.gz" ! -name "${tarball##*/}" -delete
		say "stand-in: cached $tarball ($(du -h "$tarball" | cut -f1), $((SECONDS - start)) s)"
	else
		say "stand-in: using cached $tarball"
	fi
	load_standin "$arch" "$tarball" "$image" "$version"
	local probe='import platform; print(platform.machine(), "Python", platform.python_version())'
	local facts want=x86_64
	[[ "$arch" == arm64 ]] && want=aarch64
	facts="$("$DOCKER" run --rm --network none --platform "linux/$arch" "$image" python3 -c "$probe")"
	[[ "$facts" == "$want "* ]] || die "stand-in $image reports '$facts', expected $want"
	say "stand-in: loaded $image: $facts"
}

step_standin_amd64() {
	ensure_standin amd64 "$STANDIN_IMAGE" "$STANDIN_VERSION"
}

step_standin_arm64() {
	ensure_standin arm64 "$STANDIN_ARM64_IMAGE" "$STANDIN_ARM64_VERSION"
}

# ---------------------------------------------------------------------------------------------
# 6. Local registry (distribution 2.8) with htpasswd auth, loopback only
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
# 7. The two stand-ins as one image index in the test registry
# ---------------------------------------------------------------------------------------------
# Set by step_multiarch for the test-env file: digests of the index and of each arch's manifest.
INDEX_DIGEST="" AMD64_DIGEST="" ARM64_DIGEST=""

# The tool's own publishing path (scripts/push_images.py: each stand-in by digest, the index
# under the tag, each arch also under <tag>-<arch>); it pushes nothing when the tag already names
# exactly these two images. The test credentials go through the environment, never ~/.docker.
step_multiarch() {
	local digests
	digests="$(BSI_REGISTRY="$REGISTRY_ADDR" BSI_REGISTRY_USER="$REGISTRY_USER" \
		BSI_REGISTRY_PASSWORD="$REGISTRY_PASSWORD" \
		"$VENV/bin/python" scripts/push_images.py "$MULTIARCH_BASE" \
		"amd64=$STANDIN_IMAGE" "arm64=$STANDIN_ARM64_IMAGE")" ||
		die "pushing the index $MULTIARCH_BASE failed"
	read -r INDEX_DIGEST AMD64_DIGEST ARM64_DIGEST <<<"$digests"
	[[ "$INDEX_DIGEST" == sha256:* && "$AMD64_DIGEST" == sha256:* && "$ARM64_DIGEST" == sha256:* ]] ||
		die "registry does not serve the index $MULTIARCH_BASE"
	say "multi-arch: $MULTIARCH_BASE names amd64 $AMD64_DIGEST and arm64 $ARM64_DIGEST"
}

# Debian 13's package SPEC (apt-get download's form: NAME or NAME=VERSION*) unpacked into DIR.tmp,
# the .deb's path printed; the caller checks it and moves DIR.tmp into place. Trixie's source
# list, lists and cache are the script's own: nothing of the machine's apt configuration changes.
trixie_unpack() {
	local spec="$1" dir="$2" apt_dir="$CACHE_DIR/trixie-apt" opts deb
	mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/debs"
	printf 'deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] %s trixie main\n' \
		"$STANDIN_MIRROR" >"$apt_dir/sources.list"
	opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
		-o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache"
		-o APT::Sandbox::User=root -qq)
	apt-get "${opts[@]}" update >&2 || die "apt-get update against trixie failed"
	(cd "$apt_dir/debs" && rm -f "${spec%%=*}"_*.deb && apt-get "${opts[@]}" download "$spec" >&2) ||
		die "apt-get download $spec failed"
	deb="$(ls "$apt_dir/debs/${spec%%=*}"_*.deb)"
	rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
	dpkg-deb -x "$deb" "$dir.tmp"
	printf '%s\n' "$deb"
}

# ---------------------------------------------------------------------------------------------
# 8. cosign (Debian 13's), for the signature tests
# ---------------------------------------------------------------------------------------------
COSIGN_VERSION="2.5.0"
COSIGN_DIR="$CACHE_DIR/cosign-$COSIGN_VERSION"
COSIGN="$COSIGN_DIR/usr/bin/cosign"

# Debian 12's skopeo is built without sigstore, so the real cosign is the only honest verifier.
# Its trixie package is fetched with a source list, lists and cache of its own: nothing of the
# machine's apt configuration changes.
step_cosign() {
	if [[ -x "$COSIGN" ]] && "$COSIGN" version >/dev/null 2>&1; then
		say "cosign: cached ($COSIGN)"
		return 0
	fi
	local deb
	say "cosign: fetching Debian 13's cosign package"
	deb="$(trixie_unpack cosign "$COSIGN_DIR")" || die "fetching Debian 13's cosign failed"
	# Debian's build reports "devel" as its version: the package's own version is checked.
	[[ "$(dpkg-deb -f "$deb" Version)" == "$COSIGN_VERSION"-* ]] ||
		die "$deb is not cosign $COSIGN_VERSION"
	"$COSIGN_DIR.tmp/usr/bin/cosign" version >/dev/null 2>&1 || die "$deb's cosign does not run"
	rm -rf "$COSIGN_DIR" && mv "$COSIGN_DIR.tmp" "$COSIGN_DIR"
	say "cosign: $COSIGN"
}

# ---------------------------------------------------------------------------------------------
# 9. soci-snapshotter (Debian 13's), for the SOCI tests' lazy node
# ---------------------------------------------------------------------------------------------
SOCI_VERSION="0.4.1"
SOCI_DIR="$CACHE_DIR/soci-snapshotter-$SOCI_VERSION"
SOCI_BIN="$SOCI_DIR/usr/bin"

# The snapshotter a node runs beside containerd, and the `soci` CLI that reads ztocs back
# (tests/integration/test_soci_snapshotter.py); its Go binaries need only libc6. Fetched like cosign.
step_soci() {
	if [[ -x "$SOCI_BIN/soci" && -x "$SOCI_BIN/soci-snapshotter-grpc" ]]; then
		say "soci-snapshotter: cached ($SOCI_BIN)"
		return 0
	fi
	say "soci-snapshotter: fetching Debian 13's package"
	trixie_unpack "soci-snapshotter=$SOCI_VERSION*" "$SOCI_DIR" >/dev/null ||
		die "fetching Debian 13's soci-snapshotter failed"
	rm -rf "$SOCI_DIR" && mv "$SOCI_DIR.tmp" "$SOCI_DIR"
	say "soci-snapshotter: $("$SOCI_BIN/soci" --version 2>/dev/null | head -1)"
}

# ---------------------------------------------------------------------------------------------
# test-env file
# ---------------------------------------------------------------------------------------------
write_test_env() {
	mkdir -p "$(dirname "$TEST_ENV_FILE")"
	local tmp="$TEST_ENV_FILE.tmp.$$" multiarch=""
	# The index's keys only once it is pushed (--arm64): until then the tests that need it wait
	# for that step (tests/conftest.py's arm64_standin).
	if [[ -n "$INDEX_DIGEST" ]]; then
		multiarch="
  \"multiarch_base\": \"$MULTIARCH_BASE\",
  \"multiarch_base_index\": \"$MULTIARCH_REPO@$INDEX_DIGEST\",
  \"multiarch_base_amd64\": \"$MULTIARCH_REPO@$AMD64_DIGEST\",
  \"multiarch_base_arm64\": \"$MULTIARCH_REPO@$ARM64_DIGEST\","
	fi
	cat >"$tmp" <<EOF
{
  "docker": "$DOCKER",
  "docker_host": "$DOCKER_SOCK",
  "base_image": "$STANDIN_IMAGE",
  "base_image_arm64": "$STANDIN_ARM64_IMAGE",$multiarch
  "registry": "$REGISTRY_ADDR",
  "registry_user": "$REGISTRY_USER",
  "registry_password": "$REGISTRY_PASSWORD",
  "ca_bundle": "/etc/ssl/certs/ca-certificates.crt",
  "registry_dir": "$REGISTRY_DIR",
  "cosign": "$COSIGN",
  "soci": "$SOCI_BIN/soci",
  "soci_snapshotter": "$SOCI_BIN/soci-snapshotter-grpc"
}
EOF
	mv "$tmp" "$TEST_ENV_FILE"
	say "test env: $TEST_ENV_FILE"
}

# The arm64 half: its stand-in (about 11 min under emulation on a fresh machine, then cached)
# and the two-arch index, serialized by a lock so that a background run and a test that waits
# for it never build twice.
step_arm64() {
	mkdir -p "$CACHE_DIR"
	exec 9>"$CACHE_DIR/arm64.lock"
	flock 9
	timed step_emulation
	timed step_standin_arm64
	timed step_registry
	timed step_multiarch
	write_test_env
	flock -u 9
}

# Whether the arm64 half has anything to do: its stand-in image is missing or of another recipe.
arm64_pending() {
	[[ "$(standin_label "$STANDIN_ARM64_IMAGE" || true)" != "$STANDIN_ARM64_VERSION" ]]
}

# timed STEP: runs STEP and says how long it took (the second run's budget is a few seconds).
timed() {
	local start=${EPOCHREALTIME/./}
	"$@"
	local us=$((${EPOCHREALTIME/./} - start))
	say "  ($1: $((us / 1000000)).$(printf '%02d' $((us / 10000 % 100))) s)"
}

main() {
	local start=$SECONDS mode="${1:-}"
	case "$mode" in
	--venv-only)
		step_venv
		return 0
		;;
	--example)
		# What `make example` needs: no registry, no emulation, no arm64 stand-in.
		timed step_packages
		timed step_venv
		timed step_engine
		timed step_standin_amd64
		say "ready for the example in $((SECONDS - start)) s"
		return 0
		;;
	--arm64)
		step_arm64
		say "arm64 ready in $((SECONDS - start)) s"
		return 0
		;;
	"" | --all) ;;
	*) die "unknown option $mode (usage: setup-env.sh [--all | --example | --arm64 | --venv-only])" ;;
	esac
	timed step_packages
	timed step_venv
	timed step_engine
	timed step_emulation
	timed step_standin_amd64
	timed step_registry
	timed step_cosign
	timed step_soci
	if arm64_pending; then
		# Built in the background while the tests that need no arm64 run first; those that do
		# run last and wait for it (tests/conftest.py).
		mkdir -p "$STATE_LOG_DIR"
		local log="$STATE_LOG_DIR/setup-arm64.log"
		say "arm64: building the stand-in and the two-arch index in the background (log: $log)"
		write_test_env
		setsid "$REPO_ROOT/scripts/setup-env.sh" --arm64 >"$log" 2>&1 </dev/null &
	else
		step_arm64
	fi
	say "ready in $((SECONDS - start)) s"
}

# Sourced (tests/test_setup_env.py reads single steps), it defines its functions and runs nothing.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
	main "$@"
fi
