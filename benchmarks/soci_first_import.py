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
pull`: fetch, then unpack). Each round gives two times from the pull's start: the sandbox
server's first answer to `GET /` (started by `ctr run`), and the end of its first import of the
set; and the bytes the node had fetched at each, from the TLS registry's access log. A node
writes to a tmpfs of its own (see socinode.py for what ext4 did to the normal pulls before).

Targets, to the set's first import: ours lazily / hand normally <= 0.5; ours / create <= 1.0.

    .venv/bin/python benchmarks/soci_first_import.py [--rounds 3] [--set "scikit-learn ..."]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, NamedTuple

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
    """The exec'd script: it prints the monotonic clock (the host's: no time namespace) when the
    server first answers `GET /` and when the set's import has finished."""
    code = "; ".join(f"import {m}" for m in modules)
    return f"""
import json, time, urllib.request as u
for _ in range(6000):
    try:
        u.urlopen("http://127.0.0.1:8888/"); break
    except OSError:
        time.sleep(0.01)
print("answered", time.monotonic(), flush=True)
body = json.dumps({{"command": ["python3", "-c", {code!r}], "timeout_seconds": 300}})
request = u.Request("http://127.0.0.1:8888/execute", body.encode(),
                    {{"Content-Type": "application/json"}})
answer = json.loads(u.urlopen(request, timeout=600).read())
assert answer["exit_code"] == 0, answer
print("imported", time.monotonic(), flush=True)
"""


class Timing(NamedTuple):
    """One variant's round: seconds from the pull's start and the bytes the node had fetched
    (the registry logs a request when it ends) at the server's first answer and at the end of
    the set's first import; the pull's share, and for a normal pull its fetch and unpack."""

    answer: float
    answer_bytes: int
    imported: float
    imported_bytes: int
    pull: float
    phases: str


def go_seconds(duration: str) -> float:
    """A Go duration as ctr prints it (`16.9s`, `1m2.5s`, `850ms`) in seconds."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "µs": 1e-6, "us": 1e-6, "ns": 1e-9}
    return sum(float(n) * units[u] for n, u in re.findall(r"([\d.]+)(ms|µs|us|ns|h|m|s)", duration))


def pull_phases(output: str) -> str:
    """ctr 1.6 fetches every blob, then unpacks layer by layer: its output gives both."""
    fetched = re.findall(r"elapsed: ([\d.]+) s", output)
    unpacked = re.findall(r"^done: (\S+)", output, re.MULTILINE)
    if not fetched or not unpacked:
        return ""
    return f"fetch {float(fetched[-1]):.1f} s, unpack {go_seconds(unpacked[-1]):.1f} s"


def timed_start(
    env: dict[str, Any], tls: TlsRegistry, work: Path, reference: str, lazy: bool, code: str
) -> Timing:
    """One fresh node: the pull (`soci image rpull` or `ctr images pull`), `ctr run` of the
    server, then one exec that waits for its first answer and imports the set."""
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
        process = node.popen(
            "ctr", "-a", str(node.containerd_socket), "task", "exec", "--exec-id", "i", "b",
            "python3", "-c", code,
        )  # fmt: skip
        assert process.stdout is not None
        marks: dict[str, tuple[float, int]] = {}
        for line in process.stdout:  # the log is read the moment each line arrives
            what, _, clock = line.partition(" ")
            if what in ("answered", "imported"):
                marks[what] = (float(clock) - started, tls.sent(mark)[0])
        _, errors = process.communicate(timeout=900)
        assert process.returncode == 0 and len(marks) == 2, errors[-2000:]
    return Timing(*marks["answered"], *marks["imported"], pull, pull_phases(pulled.stdout))


def build_ours(
    env: dict[str, Any], work: Path, packages: list[str], base_image: str, repository: str
) -> tuple[str, dict[str, Any]]:
    """The CLI's build, verification and push of the set: the digest and report.json's soci."""
    (work / "requirements.txt").write_text("\n".join(packages) + "\n")
    credentials = {
        "BSI_REGISTRY_USER": env["registry_user"],
        "BSI_REGISTRY_PASSWORD": env["registry_password"],
    }
    run(sys.executable, "-m", "builder", "-r", str(work / "requirements.txt"),
        "--base-image", base_image, "--arch", "amd64",
        "--push", f"{env['registry']}/{repository}", "--output", str(work / "context"),
        cwd=REPO, env={**os.environ, **credentials})  # fmt: skip
    report = json.loads((work / "context" / "report.json").read_text())["image"]
    return report["digest"], report["soci"]


def build_hand(
    env: dict[str, Any], work: Path, packages: list[str], base_image: str, tag: str
) -> str:
    """The hand-written recipe built by Docker and pushed as `tag`: its digest."""
    host, user, password = env["registry"], env["registry_user"], env["registry_password"]
    (work / "hand").mkdir()
    (work / "hand" / "Dockerfile").write_text(
        HAND.format(base=base_image, packages=" ".join(packages))
    )
    docker_env = {  # a login of its own: the machine's docker config is left alone
        **os.environ, "DOCKER_CONFIG": str(work / "docker"), "DOCKER_BUILDKIT": "1",
        "DOCKER_HOST": env["docker_host"],
    }  # fmt: skip
    run("/usr/bin/docker", "build", "--secret", f"id=ca,src={env['ca_bundle']}",
        "-t", tag, str(work / "hand"), env=docker_env)  # fmt: skip
    run("/usr/bin/docker", "login", "-u", user, "--password-stdin", host, input=password,
        env=docker_env)  # fmt: skip
    pushed = run("/usr/bin/docker", "push", tag, env=docker_env).stdout
    digest = next(w for w in pushed.split() if w.startswith("sha256:"))
    run("/usr/bin/docker", "rmi", tag, env=docker_env)  # pushed: the registry holds it
    return digest


def index_with_soci_create(
    env: dict[str, Any], work: Path, tls: TlsRegistry, reference: str
) -> None:
    """`reference` (our manifest, mounted in a repository of its own) indexed by the real
    `soci create` and `soci push` on a node of its own."""
    user, password = env["registry_user"], env["registry_password"]
    indexing = work / "indexing"
    indexing.mkdir()
    with SociNode(indexing, env["soci"], env["soci_snapshotter"], tls, (user, password)) as node:
        secret = f"{user}:{password}"
        assert node.ctr("images", "pull", "--user", secret, reference).returncode == 0
        assert node.soci("create", reference).returncode == 0
        pushed_index = node.soci("push", "--user", secret, reference)
        assert pushed_index.returncode == 0, pushed_index.stderr


def measure_rounds(
    env: dict[str, Any],
    tls: TlsRegistry,
    work: Path,
    variants: dict[str, tuple[str, bool]],
    count: int,
    code: str,
) -> dict[str, list[Timing]]:
    """`count` rounds of a fresh node per variant (`name: (reference, lazy)`), in alternating
    order, each round's timing printed as it comes."""
    rounds: dict[str, list[Timing]] = {name: [] for name in variants}
    for index in range(count):
        order = list(variants) if index % 2 == 0 else list(reversed(variants))
        for name in order:
            node_dir = work / f"node-{index}-{name}"
            node_dir.mkdir()
            reference, lazy = variants[name]
            rounds[name].append(timed_start(env, tls, node_dir, reference, lazy, code))
            t = rounds[name][-1]
            phases = f", {t.phases}" if t.phases else ""
            print(f"round {index + 1} {name}: first answer {t.answer:.1f} s "
                  f"({t.answer_bytes / 2**20:.1f} MiB), import {t.imported:.1f} s "
                  f"({t.imported_bytes / 2**20:.1f} MiB); pull {t.pull:.1f} s{phases}",
                  flush=True)  # fmt: skip
    return rounds


def compare(rounds: dict[str, list[Timing]], soci: dict[str, Any]) -> None:
    """The medians per variant, report.json's estimate, and the ratios against the targets."""

    def median(name: str, field: str) -> float:
        return statistics.median(getattr(t, field) for t in rounds[name])

    for name in rounds:
        print(f"{name}: median first answer {median(name, 'answer'):.1f} s "
              f"({median(name, 'answer_bytes') / 2**20:.1f} MiB), import "
              f"{median(name, 'imported'):.1f} s ({median(name, 'imported_bytes') / 2**20:.1f}"
              f" MiB), pull {median(name, 'pull'):.1f} s")  # fmt: skip
    first = soci["lazy_first_import_bytes"]  # null: the verification gave no reads
    estimate = "?" if first is None else f"{first / 2**20:.1f}"
    print(f"ours, report.json: {soci['lazy_before_mount_bytes'] / 2**20:.1f} MiB before the"
          f" mount, {estimate} MiB before the set's first import,"
          f" {soci['normal_pull_bytes'] / 2**20:.1f} MiB in a normal pull")  # fmt: skip
    for field, what in (("imported", "the set's first import"), ("answer", "first answer")):
        hand, create = median("hand", field), median("create", field)
        print(
            f"to {what}: ours lazily / hand normally {median('ours', field) / hand:.2f}x"
            f" (target <= 0.5), ours / soci create's index"
            f" {median('ours', field) / create:.2f}x (target <= 1.0)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--set", default=DEFAULT_SET)
    parser.add_argument("--base-image", default="bsi-reference:test")
    args = parser.parse_args()
    env = json.loads((REPO / ".test-env.json").read_text())
    host = env["registry"]
    packages = args.set.split()
    modules = [{"scikit-learn": "sklearn", "beautifulsoup4": "bs4"}.get(p, p) for p in packages]
    run_id = uuid.uuid4().hex[:8]
    with tempfile.TemporaryDirectory(prefix="bsi-soci-bench-") as scratch:
        work = Path(scratch)
        ours_repo = f"bsi-soci-bench-{run_id}/ours"
        digest, soci = build_ours(env, work, packages, args.base_image, ours_repo)
        hand_tag = f"{host}/bsi-soci-bench-{run_id}/hand:1"
        hand_digest = build_hand(env, work, packages, args.base_image, hand_tag)
        create_repo = f"bsi-soci-bench-{run_id}/create"
        login = argparse.Namespace(user=env["registry_user"], password=env["registry_password"])
        mount_image(login, f"{host}/{ours_repo}@{digest}", f"{host}/{create_repo}:1")
        with TlsRegistry(work, Path(env["registry_dir"]), writable=True) as tls:
            index_with_soci_create(env, work, tls, f"{tls.host}/{create_repo}@{digest}")
            variants = {
                "ours": (f"{tls.host}/{ours_repo}@{digest}", True),
                "create": (f"{tls.host}/{create_repo}@{digest}", True),
                "hand": (f"{tls.host}/bsi-soci-bench-{run_id}/hand@{hand_digest}", False),
            }
            rounds = measure_rounds(env, tls, work, variants, args.rounds, first_import(modules))
    compare(rounds, soci)


if __name__ == "__main__":
    main()
