"""The sandbox runtime contract's constants, in one place.

What every sandbox image must serve and how the platform runs it: the sandbox user, the port,
the workspace, where libraries live and in which order, the timeout exit code and the routes.
The planner, the renderer, the probe and the verifier read them from here. The in-image server
(`builder/runtime/server/`) keeps its own copies: it runs with `python3 -I` from a bare image
and imports nothing but the standard library. Imports nothing itself, so any layer may use it.
"""

from __future__ import annotations

SANDBOX_UID = 65532
SANDBOX_GID = 65532
SANDBOX_USER = f"{SANDBOX_UID}:{SANDBOX_GID}"  # numeric, so runAsNonRoot can prove it
PORT = 8888
WORKSPACE = "/workspace"  # writable, the root of every file route and the default cwd
DEPS = "/app/deps"  # the base image's libraries
DEPS_EXTRA = "/app/deps-extra"  # the extension's libraries, appended after the base's
# the image label naming the interpreter build that compiled DEPS_EXTRA's .pyc, or "none", or
# BYTECODE_BY_STEP: compiled by the Dockerfile's own step (a context written with --no-build)
BYTECODE_LABEL = "org.build-sandbox-image.bytecode"
BYTECODE_BY_STEP = "dockerfile"
TIMEOUT_EXIT_CODE = 124  # a command killed for running past timeout_seconds
# The sandbox user's home, on the writable /tmp the platform mounts (docs/contract.md says why
# there); HOME, XDG_CACHE_HOME and XDG_CONFIG_HOME name it in every image the tool builds.
HOME = "/tmp/home"
# Caches built at image-build time (read-only, root-owned), copied into HOME by the server at start
HOME_SEED = "/opt/sandbox/home"

# Routes. File routes take a workspace-relative path, percent-encoded with `/` as %2F.
HEALTH = "/"  # GET -> 200
# POST {command, timeout_seconds, env, cwd} -> {stdout, stderr, exit_code, timed_out}
EXECUTE = "/execute"
UPLOAD = "/upload"  # POST multipart/form-data, field UPLOAD_FIELD, filename = destination path
UPLOAD_FIELD = "file"
DOWNLOAD = "/download/"  # GET + path -> the bytes
LIST = "/list/"  # GET + path -> [{name, size, type: file|directory, mod_time}]
EXISTS = "/exists/"  # GET + path -> {path, exists}
FILES = "/files/"  # DELETE + path
