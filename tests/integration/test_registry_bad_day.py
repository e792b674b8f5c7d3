"""A registry's bad day, through the CLI, against the real local registry behind a fault proxy.

The reference base is pushed to the registry and named through the proxy
(tests/support/faultproxy.py), so that the tool reads it from there and the push mounts its
blobs. One module-scoped flaky build (about 20 % of the tool's requests failing once and 10 %
twice, every kind of fault, the first GET of the base's manifest a 500, the first manifest
PUT a 429 with `Retry-After: 2`) is checked by several tests: it exits 0, every manifest and
blob of the pushed index (attachments included) is in the registry and hashes to its digest,
the lowest layers are the base's own blobs, the recorded base digest is the registry's, and the
429 was not tried again sooner than 2 s. Then the same build to another repository meets a
registry that answers 503 to everything from its first manifest PUT on: exit 1, one `error:`
line naming the registry, no tag, the template unchanged; clean again, the same command exits
0, uploads none of the blobs the failed run completed, and is asked each request once.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.faultproxy import FaultProxy, Logged, Plan, Rule
from support.machine import Registry
from support.registryhelp import push, registry_get, registry_tags

pytestmark = pytest.mark.usefixtures("docker_client", "registry", "package_index")

RUN = uuid.uuid4().hex[:8]
NAMESPACE = f"bsi-bad-day-{RUN}"
TEMPLATE = """\
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxTemplate
metadata:
  name: bad-day
spec:
  podTemplate:
    spec:
      containers:
        - name: sandbox
          image: registry.example.com/old:1  # replaced by the tool
"""


def cli(registry: Registry, work: Path, base: str, repository: str, name: str):
    (work / "requirements.txt").write_text("six==1.16.0\n")
    env = {
        **os.environ,
        "UV_CACHE_DIR": str(work / "uv-cache"),
        "BSI_REGISTRY_USER": registry.user,
        "BSI_REGISTRY_PASSWORD": registry.password,
        "BSI_DEBUG": "",
    }
    return subprocess.run(
        [sys.executable, "-m", "builder", "-r", str(work / "requirements.txt"),
         "--base-image", base, "--tag", f"{NAMESPACE}/{name}:test",
         "--output", str(work / name), "--cache-dir", str(work / "cache"),
         "--push", repository, "--template", str(work / "template.yaml"), "--no-verify"],
        capture_output=True, text=True, env=env, timeout=1800,
    )  # fmt: skip


@pytest.fixture(scope="module")
def bad_day(
    registry: Registry, reference_image: str, docker_client: Any, tmp_path_factory
) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("bad-day")
    (work / "template.yaml").write_text(TEMPLATE)
    pushed_base = f"{registry.host}/{NAMESPACE}/runtime:1.0.0"
    docker_client.images.get(reference_image).tag(pushed_base)
    push(docker_client, registry, pushed_base)
    proxy = FaultProxy(
        registry.host,
        Plan(
            seed=36,
            once=0.2,
            twice=0.1,
            retry_after=1,
            rules=(  # each kind at least once, wherever the seed puts the others
                Rule(r"^(HEAD|GET) /v2/.*/runtime/manifests/1\.0\.0$", "500"),
                Rule(r"^PUT /v2/.*/manifests/sha256:", "429"),
                Rule(r"^POST /v2/.*/ext/blobs/uploads/$", "drop-before"),
                Rule(r"^PUT /v2/.*/ext/blobs/uploads/", "drop-after"),
                Rule(r"^PATCH /v2/.*/ext/blobs/uploads/", "drop-after"),
                Rule(r"^GET /v2/.*/blobs/sha256:", "cut"),
                Rule(r"^HEAD /v2/.*/ext/blobs/sha256:", "502"),
                Rule(r"^HEAD /v2/.*/ext/blobs/sha256:", "503"),
            ),
        ),
    )
    base = f"{proxy.host}/{NAMESPACE}/runtime:1.0.0"
    # The engine holds a copy of the base under the name the tool is given (as a runner that
    # built or pulled it before): whether it is current is asked of the registry, and that
    # first request fails (issue 36: it used to make the run take the engine's copy silently).
    docker_client.images.get(reference_image).tag(base)
    try:
        result = cli(registry, work, base, f"{proxy.host}/{NAMESPACE}/ext", "flaky")
        yield {"work": work, "proxy": proxy, "result": result, "log": proxy.log, "base": base}
    finally:
        proxy.close()
        names = [pushed_base, base, *(f"{NAMESPACE}/{n}:test" for n in ("flaky", "down"))]
        subprocess.run(["docker", "rmi", "-f", *names], capture_output=True, check=False)


def get(registry: Registry, repository: str, kind: str, reference: str) -> tuple[bytes, str]:
    with registry_get(registry, f"/v2/{repository}/{kind}/{reference}") as response:
        body = response.read()
    return body, "sha256:" + hashlib.sha256(body).hexdigest()


def test_a_flaky_registry_still_pushes(bad_day: dict[str, Any]) -> None:
    result = bad_day["result"]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    faults = [one for one in bad_day["log"] if one.action != "forward"]
    kinds = {"500", "502", "503", "429", "drop-before", "drop-after", "cut"}
    assert {one.action for one in faults} == kinds, faults
    report = json.loads((bad_day["work"] / "flaky" / "report.json").read_text())
    assert len(report["registry_retries"]) >= len(faults) // 2
    assert "trying again in" in result.stdout


def test_everything_pushed_is_there_and_hashes(bad_day: dict[str, Any], registry: Registry) -> None:
    report = json.loads((bad_day["work"] / "flaky" / "report.json").read_text())
    repository, digest = report["image"]["pushed"].split("/", 1)[1].split("@")
    top, served = get(registry, repository, "manifests", digest)
    assert served == digest
    document = json.loads(top)
    manifests = document.get("manifests") or [{"digest": digest}]
    for entry in manifests:
        body, served = get(registry, repository, "manifests", entry["digest"])
        assert served == entry["digest"]
        image = json.loads(body)
        for blob in [image["config"], *image["layers"]]:
            assert get(registry, repository, "blobs", blob["digest"])[1] == blob["digest"]
    referrers = registry_tags(registry, repository, referrers=True)
    assert referrers, "no attachments listed"  # SBOM, provenance, SOCI index
    for tag in referrers:
        index = json.loads(get(registry, repository, "manifests", tag)[0])
        for entry in index.get("manifests", []):  # a referrers index (other tags: images)
            body, served = get(registry, repository, "manifests", entry["digest"])
            assert served == entry["digest"]
            for blob in json.loads(body)["layers"]:
                assert get(registry, repository, "blobs", blob["digest"])[1] == blob["digest"]
    assert report["image"]["pushed"] in (bad_day["work"] / "template.yaml").read_text()


def test_the_base_is_the_registrys_own(bad_day: dict[str, Any], registry: Registry) -> None:
    """Its recorded digest is the one the registry serves, its layers are mounted, not
    uploaded anew, although the first GET of its manifest failed."""
    first = [one for one in bad_day["log"] if one.path.endswith("/runtime/manifests/1.0.0")]
    assert first and first[0].action == "500" and first[0].agent.startswith("Python-urllib")
    result = bad_day["result"]
    assert "engine's copy" not in result.stdout + result.stderr  # no fallback, not even said
    report = json.loads((bad_day["work"] / "flaky" / "report.json").read_text())
    base_repo = f"{NAMESPACE}/runtime"
    base_top, base_digest = get(registry, base_repo, "manifests", "1.0.0")
    assert report["base"]["digest"] == base_digest
    base_manifest = json.loads(base_top)
    if "manifests" in base_manifest:
        base_manifest = json.loads(
            get(registry, base_repo, "manifests", base_manifest["manifests"][0]["digest"])[0]
        )
    base_layers = [layer["digest"] for layer in base_manifest["layers"]]
    repository, digest = report["image"]["pushed"].split("/", 1)[1].split("@")
    top = json.loads(get(registry, repository, "manifests", digest)[0])
    entry = (top.get("manifests") or [{"digest": digest}])[0]["digest"]
    layers = [
        layer["digest"]
        for layer in json.loads(get(registry, repository, "manifests", entry)[0])["layers"]
    ]
    assert layers[: len(base_layers)] == base_layers
    assert report["image"]["bytes_mounted"] > 0


def test_a_429_is_not_tried_again_before_its_retry_after(bad_day: dict[str, Any]) -> None:
    log = bad_day["log"]
    limited = next(i for i, one in enumerate(log) if one.action == "429")
    again = next(
        one for one in log[limited + 1 :]
        if (one.method, one.path) == (log[limited].method, log[limited].path)
    )  # fmt: skip
    assert again.at - log[limited].at >= 1.0  # this plan's Retry-After: 1


def sent(one: Logged) -> str | None:
    """The blob a request uploads (its closing PUT) or mounts; None for any other request."""
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(one.path).query)
    if one.method == "PUT" and "digest" in query:
        return query["digest"][0]
    if one.method == "POST" and "mount" in query:
        return query["mount"][0]
    return None


def test_a_registry_down_midway_then_back(bad_day: dict[str, Any], registry: Registry) -> None:
    proxy, work = bad_day["proxy"], bad_day["work"]
    repository = f"{proxy.host}/{NAMESPACE}/down"
    template = (work / "template.yaml").read_text()
    # first: a 429 with Retry-After: 2, not tried sooner; then everything 503 midway
    proxy.replan(
        Plan(retry_after=2, rules=(Rule(r"^PUT /v2/.*/manifests/sha256:", "429"),),
             down_after=r"^PUT /v2/.*/manifests/sha256:")
    )  # fmt: skip
    started, mark = time.monotonic(), len(proxy.log)
    failed = cli(registry, work, bad_day["base"], repository, "down")
    assert time.monotonic() - started < 180 + 300  # the build before the push, on a busy machine
    assert failed.returncode == 1, failed.stdout[-2000:]
    lines = [line for line in failed.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and failed.stderr.strip().endswith(lines[0]), failed.stderr
    assert "Traceback" not in failed.stderr + failed.stdout
    assert f"registry {proxy.host} answered 503" in lines[0] and "after 5 tries" in lines[0]
    assert f"/v2/{NAMESPACE}/down/manifests/sha256:" in lines[0]  # repository and object
    retried = json.loads((work / "down" / "report.json").read_text())["registry_retries"]
    failing = [one for one in retried if one["request"].startswith(f"PUT {NAMESPACE}/down/man")]
    assert len(failing) >= 4 and failing[-1]["answer"] == "503"  # the failed push's record
    assert registry_tags(registry, f"{NAMESPACE}/down") == []
    assert (work / "template.yaml").read_text() == template
    log = proxy.log[mark:]
    limited = next(i for i, one in enumerate(log) if one.action == "429")
    again = next(one for one in log[limited + 1 :] if one.path == log[limited].path)
    assert again.at - log[limited].at >= 2.0
    first_503 = next(one.at for one in log if one.action == "503")
    assert log[-1].at - first_503 < 180
    completed = {sent(one) for one in log if sent(one) and one.status == 201}

    proxy.replan(Plan())
    mark = len(proxy.log)
    again_run = cli(registry, work, bad_day["base"], repository, "down")
    assert again_run.returncode == 0, again_run.stdout[-2000:] + again_run.stderr[-2000:]
    clean = proxy.log[mark:]
    resent = {sent(one) for one in clean if sent(one)}
    assert completed and not (completed & resent)
    report = json.loads((work / "down" / "report.json").read_text())
    assert report["registry_retries"] == []
    assert all(one.status is not None and one.status < 500 for one in clean)
