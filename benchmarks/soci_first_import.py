"""Issue 31's figures in one run: pull to first import on fresh nodes, lazily and normally.

Three images of one set on the reference base, in the local test registry:
  ours    built, verified and pushed by the CLI: its own SOCI index, its layers laid out for the
          import, and report.json's estimate of what a lazy node fetches before the import;
  create  the same manifest mounted into a second repository and indexed there by the real
          `soci create` + `soci push` (soci-snapshotter 0.4.1): same layers, soci's own index;
  hand    the hand-written recipe (`pip install --target /app/deps-extra` in a builder stage,
          libgomp1 in the final one), built by Docker and pushed with `docker push`.
Each round starts a fresh node (tests/support/socinode.py: a private containerd 1.6 and
soci-snapshotter-grpc 0.4.1, the registry's storage served over TLS) per variant, in alternating
order: ours and create pulled lazily (`soci image rpull`), hand pulled normally (`ctr images
pull`); the clock stops when the sandbox server, started by `ctr run`, has imported the set. The
bytes each node fetched before that come from the TLS registry's access log.

Targets: ours lazily / hand normally <= 0.5; ours / create <= 1.0.

    .venv/bin/python benchmarks/soci_first_import.py [--rounds 3] [--set "scikit-learn ..."]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the node harness the real-snapshotter test uses

from support.registryhelp import mount_image  # noqa: E402
from support.socinode import SociNode, TlsRegistry  # noqa: E402

DEFAULT_SET = "scikit-learn matplotlib sympy lightgbm beautifulsoup4"
MOUNT = "type=tmpfs,src=tmpfs,dst=/workspace,options=rw:uid=65532:gid=65532"
HAND = """FROM {base} AS builder
USER root
RUN --mount=type=secret,id=ca,target=/etc/ssl/certs/ca-certificates.crt \\
    python3 -m pip install --no-cache-dir --target /app/deps-extra {packages}
FROM {base}
USER root
RUN apt-get update && apt-get install -y --no-install-recommends libgomp1 \\
    && rm -rf /var/lib/apt/lists/*
COPY --from=builder /app/deps-extra /app/deps-extra
ENV PYTHONPATH=/app/deps:/app/deps-extra
USER 65532:65532
"""


def run(*command: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command[:4])}: {result.stdout[-2000:]}{result.stderr[-2000:]}")
    return result


def first_import(modules: list[str]) -> str:
    code = "; ".join(f"import {m}" for m in modules)
    return f"""
import json, time, urllib.request as u
for _ in range(600):
    try:
        u.urlopen("http://127.0.0.1:8888/"); break
    except OSError:
        time.sleep(0.1)
body = json.dumps({{"command": ["python3", "-c", {code!r}], "timeout_seconds": 300}})
request = u.Request("http://127.0.0.1:8888/execute", body.encode(),
                    {{"Content-Type": "application/json"}})
answer = json.loads(u.urlopen(request, timeout=600).read())
assert answer["exit_code"] == 0, answer
"""


def timed_start(
    env: dict[str, Any], tls: TlsRegistry, work: Path, reference: str, lazy: bool, code: str
) -> tuple[float, float, int]:
    """Seconds from the pull to the finished first import on a fresh node, the pull's share
    of them (`soci image rpull` or `ctr images pull`), and the bytes fetched."""
    login = (env["registry_user"], env["registry_password"])
    _, mark = tls.sent()
    with SociNode(work, env["soci"], env["soci_snapshotter"], tls, login) as node:
        started = time.monotonic()
        user = ":".join(login)
        if lazy:
            pulled = node.soci("image", "rpull", "--user", user, reference, timeout=900)
            snapshotter = ["--snapshotter", "soci"]
        else:
            pulled = node.ctr("images", "pull", "--user", user, reference, timeout=900)
            snapshotter = []
        assert pulled.returncode == 0, pulled.stderr[-2000:]
        pull = time.monotonic() - started
        ran = node.ctr("run", "-d", *snapshotter, "--read-only", "--mount", MOUNT, reference, "b")
        assert ran.returncode == 0, ran.stderr
        imported = node.ctr("task", "exec", "--exec-id", "i", "b", "python3", "-c", code)
        assert imported.returncode == 0, imported.stderr[-2000:]
        elapsed = time.monotonic() - started
    sent, _ = tls.sent(mark)
    return elapsed, pull, sent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--set", default=DEFAULT_SET)
    parser.add_argument("--base-image", default="bsi-reference:test")
    args = parser.parse_args()
    env = json.loads((REPO / ".test-env.json").read_text())
    host, user, password = env["registry"], env["registry_user"], env["registry_password"]
    packages = args.set.split()
    modules = [{"scikit-learn": "sklearn", "beautifulsoup4": "bs4"}.get(p, p) for p in packages]
    run_id = uuid.uuid4().hex[:8]
    credentials = {"BSI_REGISTRY_USER": user, "BSI_REGISTRY_PASSWORD": password}
    with tempfile.TemporaryDirectory(prefix="bsi-soci-bench-") as scratch:
        work = Path(scratch)
        (work / "requirements.txt").write_text("\n".join(packages) + "\n")
        ours_repo = f"bsi-soci-bench-{run_id}/ours"
        run(sys.executable, "-m", "builder", "-r", str(work / "requirements.txt"),
            "--base-image", args.base_image, "--arch", "amd64",
            "--push", f"{host}/{ours_repo}", "--output", str(work / "context"),
            cwd=REPO, env={**os.environ, **credentials})  # fmt: skip
        report = json.loads((work / "context" / "report.json").read_text())["image"]
        digest, soci = report["digest"], report["soci"]
        hand_tag = f"{host}/bsi-soci-bench-{run_id}/hand:1"
        (work / "hand").mkdir()
        (work / "hand" / "Dockerfile").write_text(
            HAND.format(base=args.base_image, packages=" ".join(packages))
        )
        docker_env = {  # a login of its own: the machine's docker config is left alone
            **os.environ, "DOCKER_CONFIG": str(work / "docker"), "DOCKER_BUILDKIT": "1",
            "DOCKER_HOST": env["docker_host"],
        }  # fmt: skip
        run("/usr/bin/docker", "build", "--secret", f"id=ca,src={env['ca_bundle']}",
            "-t", hand_tag, str(work / "hand"), env=docker_env)  # fmt: skip
        run("/usr/bin/docker", "login", "-u", user, "--password-stdin", host, input=password,
            env=docker_env)  # fmt: skip
        pushed = run("/usr/bin/docker", "push", hand_tag, env=docker_env).stdout
        hand_digest = next(w for w in pushed.split() if w.startswith("sha256:"))
        run("/usr/bin/docker", "rmi", hand_tag, env=docker_env)  # pushed: the registry holds it
        create_repo = f"bsi-soci-bench-{run_id}/create"
        login = argparse.Namespace(user=user, password=password)
        mount_image(login, f"{host}/{ours_repo}@{digest}", f"{host}/{create_repo}:1")
        rounds: dict[str, list[tuple[float, float, int]]] = {"ours": [], "create": [], "hand": []}
        with TlsRegistry(work, Path(env["registry_dir"]), writable=True) as tls:
            indexing = work / "indexing"
            indexing.mkdir()
            login_pair = (user, password)
            with SociNode(indexing, env["soci"], env["soci_snapshotter"], tls, login_pair) as node:
                ref = f"{tls.host}/{create_repo}@{digest}"
                secret = f"{user}:{password}"
                assert node.ctr("images", "pull", "--user", secret, ref).returncode == 0
                assert node.soci("create", ref).returncode == 0
                pushed_index = node.soci("push", "--user", secret, ref)
                assert pushed_index.returncode == 0, pushed_index.stderr
            code = first_import(modules)
            variants = {
                "ours": (f"{tls.host}/{ours_repo}@{digest}", True),
                "create": (f"{tls.host}/{create_repo}@{digest}", True),
                "hand": (f"{tls.host}/bsi-soci-bench-{run_id}/hand@{hand_digest}", False),
            }
            for index in range(args.rounds):
                order = list(variants) if index % 2 == 0 else list(reversed(variants))
                for name in order:
                    node_dir = work / f"node-{index}-{name}"
                    node_dir.mkdir()
                    reference, lazy = variants[name]
                    rounds[name].append(timed_start(env, tls, node_dir, reference, lazy, code))
                    shutil.rmtree(node_dir)  # a node's unpacked snapshots: hundreds of MB each
                    elapsed, pull, sent = rounds[name][-1]
                    print(f"round {index + 1} {name}: {elapsed:.1f} s (pull {pull:.1f} s), "
                          f"{sent / 2**20:.1f} MiB")  # fmt: skip
    medians = {name: statistics.median(t for t, _, _ in runs) for name, runs in rounds.items()}
    pulls = {name: statistics.median(p for _, p, _ in runs) for name, runs in rounds.items()}
    fetched = {name: statistics.median(b for _, _, b in runs) for name, runs in rounds.items()}
    for name in rounds:
        print(f"{name}: median {medians[name]:.1f} s (pull {pulls[name]:.1f} s), "
              f"{fetched[name] / 2**20:.1f} MiB fetched")  # fmt: skip
    first = soci["lazy_first_import_bytes"]  # null: the verification gave no reads
    estimate = "?" if first is None else f"{first / 2**20:.1f}"
    print(f"ours, report.json: {soci['lazy_before_mount_bytes'] / 2**20:.1f} MiB before the"
          f" mount, {estimate} MiB before the set's first import,"
          f" {soci['normal_pull_bytes'] / 2**20:.1f} MiB in a normal pull")  # fmt: skip
    print(f"ours lazily / hand normally: {medians['ours'] / medians['hand']:.2f}x (target <= 0.5)")
    print(f"ours / soci create's index: {medians['ours'] / medians['create']:.2f}x (target <= 1.0)")


if __name__ == "__main__":
    main()
