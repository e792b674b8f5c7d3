"""Signing keys as users have them, and the cosign payloads, without an engine or registry.

The encrypted key is one Debian 13's cosign 2.5.0 made (tests/support/sign_keys/README.md), so the
envelope read here is cosign's real one; tests/integration/test_sign_cosign.py makes fresh pairs
with the cosign binary and has cosign itself check what the tool signs.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from builder.config import RunSettings, load_config, merge
from builder.errors import UserError
from builder.oci.referrers import Attachment
from builder.orchestration import commands, fleet
from builder.reporter import QUIET
from builder.sign.cosign import (
    CYCLONEDX,
    CYCLONEDX_PREDICATE,
    IN_TOTO,
    dsse_envelope,
    pae,
    simple_signing_payload,
    statements,
)
from builder.sign.keys import load_public_key, load_signing_key

KEYS = Path(__file__).resolve().parents[1] / "support" / "sign_keys"
PASSPHRASE = "bsi-test-passphrase"
REPO_ROOT = Path(__file__).resolve().parents[2]
DIGEST = "sha256:" + "ab" * 32


@pytest.fixture
def passphrase(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BSI_SIGN_PASSWORD", raising=False)
    monkeypatch.setenv("COSIGN_PASSWORD", PASSPHRASE)


def pem_key(path: Path, private: Any) -> Path:
    path.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return path


def test_cosign_encrypted_key_signs_what_its_public_key_verifies(passphrase: None) -> None:
    key = load_signing_key(KEYS / "cosign.key")
    public = load_public_key(KEYS / "cosign.pub")
    signature = key.sign(b"payload")
    assert public.verifies(signature, b"payload")
    assert not public.verifies(signature, b"another payload")
    assert key.public.pem() == public.pem()


def test_bsi_sign_password_wins_over_cosign_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BSI_SIGN_PASSWORD", PASSPHRASE)
    monkeypatch.setenv("COSIGN_PASSWORD", "not-the-passphrase")
    assert load_signing_key(KEYS / "cosign.key").public.pem() == (KEYS / "cosign.pub").read_bytes()
    monkeypatch.setenv("BSI_SIGN_PASSWORD", "wrong")
    monkeypatch.setenv("COSIGN_PASSWORD", PASSPHRASE)
    with pytest.raises(UserError, match="wrong passphrase"):
        load_signing_key(KEYS / "cosign.key")


def test_a_wrong_passphrase_is_one_error_that_does_not_repeat_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("BSI_SIGN_PASSWORD", raising=False)
    monkeypatch.setenv("COSIGN_PASSWORD", "hunter2-wrong")
    with pytest.raises(UserError) as raised:
        load_signing_key(KEYS / "cosign.key")
    assert "wrong passphrase" in str(raised.value) and "cosign.key" in str(raised.value)
    assert "hunter2" not in str(raised.value)


def test_an_encrypted_key_without_a_passphrase_says_which_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("BSI_SIGN_PASSWORD", "COSIGN_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(UserError, match="set BSI_SIGN_PASSWORD"):
        load_signing_key(KEYS / "cosign.key")


def test_a_plain_pkcs8_p256_key_loads(tmp_path: Path) -> None:
    private = ec.generate_private_key(ec.SECP256R1())
    key = load_signing_key(pem_key(tmp_path / "key.pem", private))
    assert private.public_key().public_numbers() == key.private.public_key().public_numbers()
    assert str(private.private_numbers().private_value) not in repr(key)


@pytest.mark.parametrize(
    "private",
    [ec.generate_private_key(ec.SECP384R1()), rsa.generate_private_key(65537, 2048)],
    ids=["p384", "rsa"],
)
def test_a_key_that_is_not_p256_is_refused(tmp_path: Path, private: Any) -> None:
    with pytest.raises(UserError, match="not an ECDSA P-256 key"):
        load_signing_key(pem_key(tmp_path / "key.pem", private))


def test_missing_unreadable_and_foreign_files_are_one_error_each(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"missing\.key: cannot read the signing key"):
        load_signing_key(tmp_path / "missing.key")
    (tmp_path / "cert.pem").write_text(
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
    )
    with pytest.raises(UserError, match="found CERTIFICATE"):
        load_signing_key(tmp_path / "cert.pem")
    (tmp_path / "binary").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(UserError, match="not a PEM signing key"):
        load_signing_key(tmp_path / "binary")
    with pytest.raises(UserError, match="not a PEM public key"):
        load_public_key(KEYS / "cosign.key")


def test_the_dsse_pae_is_the_spec_s_example() -> None:
    """The DSSE specification's protocol example, byte for byte."""
    assert pae("http://example.com/HelloWorld", b"hello world") == (
        b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    )


def test_the_simple_signing_payload_names_the_digest() -> None:
    payload = json.loads(simple_signing_payload("registry.example/team/app", DIGEST))
    assert payload["critical"] == {
        "identity": {"docker-reference": "registry.example/team/app"},
        "image": {"docker-manifest-digest": DIGEST},
        "type": "cosign container image signature",
    }


def test_statements_attest_exactly_the_attached_documents(passphrase: None) -> None:
    provenance = b'{"_type":"https://in-toto.io/Statement/v1","predicateType":"p","x":1}'
    bom = {"bomFormat": "CycloneDX", "specVersion": "1.6", "components": []}
    attached = [
        Attachment(CYCLONEDX, json.dumps(bom).encode()),
        Attachment(IN_TOTO, provenance),
    ]
    sbom_statement, provenance_statement = statements("r.example/app", DIGEST, attached)
    assert provenance_statement == provenance
    wrapped = json.loads(sbom_statement)
    assert wrapped["predicate"] == bom and wrapped["predicateType"] == CYCLONEDX_PREDICATE
    assert wrapped["subject"] == [{"name": "r.example/app", "digest": {"sha256": "ab" * 32}}]
    envelope = json.loads(dsse_envelope(load_signing_key(KEYS / "cosign.key"), provenance))
    assert base64.b64decode(envelope["payload"]) == provenance
    signature = base64.b64decode(envelope["signatures"][0]["sig"])
    assert load_public_key(KEYS / "cosign.pub").verifies(signature, pae(IN_TOTO, provenance))


def run_cli(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if "PASSWORD" not in k}
    return subprocess.run(
        [sys.executable, "-m", "builder", *args],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env={**clean, **env, "HOME": str(tmp_path)},
        timeout=120,
    )


@pytest.mark.parametrize(
    ("key", "password", "expected"),
    [
        ("missing.key", PASSPHRASE, "missing.key: cannot read the signing key"),
        ("cosign.key", "not-it-at-all", "cosign.key: wrong passphrase"),
    ],
)
def test_the_cli_refuses_a_bad_key_before_planning(
    tmp_path: Path, key: str, password: str, expected: str
) -> None:
    shutil.copy(KEYS / "cosign.key", tmp_path / "cosign.key")
    (tmp_path / "requirements.txt").write_text("six==1.16.0\n")
    output = tmp_path / "context"
    found = run_cli(
        tmp_path,
        *("-r", str(tmp_path / "requirements.txt"), "--output", str(output)),
        *("--push", "127.0.0.1:5000/sign/refused", "--sign-key", str(tmp_path / key)),
        COSIGN_PASSWORD=password,
    )
    assert found.returncode == 1
    lines = found.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], lines
    assert password not in found.stdout + found.stderr
    assert not output.exists()  # nothing planned, nothing written


def test_a_fleet_template_whose_key_fails_fails_alone_before_its_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fleet signs with each config's key: one that cannot sign is that template's failure,
    raised before anything of it is probed or planned."""
    monkeypatch.setenv("COSIGN_PASSWORD", "wrong")
    monkeypatch.delenv("BSI_SIGN_PASSWORD", raising=False)
    shutil.copy(KEYS / "cosign.key", tmp_path / "cosign.key")
    (tmp_path / "req.txt").write_text("six\n")
    config = tmp_path / "a.toml"
    config.write_text(
        'requirements = ["req.txt"]\nbase-repository = "127.0.0.1:5000/b"\n'
        'platform-version = "1"\nrepository = "127.0.0.1:5000/a"\nsign-key = "cosign.key"\n'
    )

    def probe(*_: object) -> None:
        raise AssertionError("probed before the key was read")

    monkeypatch.setattr(commands, "base_profile", probe)
    shared = fleet.Shared(SimpleNamespace(), SimpleNamespace(), QUIET)  # type: ignore[arg-type]
    result = fleet.rebuild_fleet(fleet.Fleet((config,), "2", 1, False), shared)
    (row,) = result.rows
    assert row.path == "failed" and "cosign.key: wrong passphrase" in row.detail


def test_the_config_s_sign_key_is_relative_to_it_and_a_flag_wins(tmp_path: Path) -> None:
    config = tmp_path / "bsi.toml"
    config.write_text(
        'requirements = ["r.txt"]\nbase-repository = "r.example/b"\nplatform-version = "1"\n'
        'sign-key = "keys/cosign.key"\n'
    )
    loaded = load_config(config)
    assert loaded.sign_key == tmp_path / "keys" / "cosign.key"
    base = loaded.base_image
    merged = merge(RunSettings((), base), loaded, output_given=False, base_given=False)
    assert merged.sign_key == loaded.sign_key
    flag = RunSettings((), base, sign_key=Path("other.key"))
    assert merge(flag, loaded, output_given=False, base_given=False).sign_key == Path("other.key")


def test_sign_key_without_push_is_refused(tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_text("six==1.16.0\n")
    found = run_cli(
        tmp_path,
        *("-r", str(tmp_path / "requirements.txt"), "--output", str(tmp_path / "out")),
        *("--sign-key", str(KEYS / "cosign.key")),
    )
    assert found.returncode == 2 and "--sign-key needs --push" in found.stderr
    assert not (tmp_path / "out").exists()


def test_cosign_1_s_label_for_the_same_envelope_is_read(tmp_path: Path, passphrase: None) -> None:
    """cosign 1.x wrote the same envelope as `ENCRYPTED COSIGN PRIVATE KEY`; keys made then
    still sign."""
    text = (KEYS / "cosign.key").read_text().replace("SIGSTORE", "COSIGN")
    (tmp_path / "old.key").write_text(text)
    assert load_signing_key(tmp_path / "old.key").public.pem() == (KEYS / "cosign.pub").read_bytes()
