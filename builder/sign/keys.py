"""The operator's signing key, as users have it: cosign's encrypted key or a PKCS#8 PEM.

`cosign generate-key-pair` writes an `ENCRYPTED SIGSTORE PRIVATE KEY` PEM whose body is JSON:
scrypt parameters and salt, a NaCl secretbox nonce, and the ciphertext of a PKCS#8 DER key.
The passphrase comes from BSI_SIGN_PASSWORD, else COSIGN_PASSWORD (cosign's own variable, so a
CI job that already signs with cosign needs nothing new). A plain `PRIVATE KEY` PEM (unencrypted
PKCS#8, as `openssl genpkey` writes it) is read as it is.

Only ECDSA P-256 is accepted: it is the scheme cosign's specification requires of every verifier
and the one Kyverno and the policy-controller check with a public key. Every failure (missing,
unreadable, wrong passphrase, another curve) is one UserError naming the file, raised before
anything is planned. The key object never prints its material, and the passphrase is not kept.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import nacl.exceptions
import nacl.secret
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from builder.errors import UserError
from builder.reporter import remember

PASSWORD_VARIABLES = ("BSI_SIGN_PASSWORD", "COSIGN_PASSWORD")
ENCRYPTED_LABEL = "ENCRYPTED SIGSTORE PRIVATE KEY"
ENCRYPTED_COSIGN_LABEL = "ENCRYPTED COSIGN PRIVATE KEY"  # what cosign 1.x wrote, same envelope
PLAIN_LABEL = "PRIVATE KEY"
MAX_KEY_FILE = 64 << 10
MAX_SCRYPT_MEMORY = 1 << 30  # 128 * r * N bytes; cosign's own parameters need 64 MiB


@dataclass(frozen=True)
class SigningKey:
    """An ECDSA P-256 private key and where it came from; its repr names only the file."""

    source: Path
    private: ec.EllipticCurvePrivateKey = field(repr=False)

    def sign(self, data: bytes) -> bytes:
        """An ASN.1 DER ECDSA signature of SHA-256(`data`): what cosign writes and checks."""
        return self.private.sign(data, ec.ECDSA(hashes.SHA256()))

    @property
    def public(self) -> PublicKey:
        """Its public half: what finds this key's signatures among those already there."""
        return PublicKey(self.source, self.private.public_key())


@dataclass(frozen=True)
class PublicKey:
    """An ECDSA P-256 public key (a `cosign.pub`, or a signing key's own half)."""

    source: Path
    key: ec.EllipticCurvePublicKey

    def verifies(self, signature: bytes, data: bytes) -> bool:
        try:
            self.key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
        except InvalidSignature:
            return False
        return True

    def pem(self) -> bytes:
        return self.key.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )


def load_signing_key(path: Path) -> SigningKey:
    """The private key in `path`, decrypted with the passphrase from the environment."""
    text = _read(path, "signing key")
    label = _pem_label(text)
    if label in (ENCRYPTED_LABEL, ENCRYPTED_COSIGN_LABEL):
        der = _decrypted(path, _pem_body(path, text), _password(path))
    elif label == PLAIN_LABEL:
        der = _pem_body(path, text)
    else:
        raise UserError(
            f"{path}: not a cosign key or a PKCS#8 private key PEM (found {label or 'no PEM'})"
        )
    try:
        private = serialization.load_der_private_key(der, password=None)
    except (ValueError, TypeError):
        raise UserError(f"{path}: the key inside is not a PKCS#8 private key") from None
    if not isinstance(private, ec.EllipticCurvePrivateKey) or private.curve.name != "secp256r1":
        raise UserError(f"{path}: not an ECDSA P-256 key (cosign signatures need P-256)")
    return SigningKey(path, private)


def load_public_key(path: Path) -> PublicKey:
    """The ECDSA P-256 public key in `path` (a `PUBLIC KEY` PEM, as cosign.pub is)."""
    text = _read(path, "public key")
    try:
        key = serialization.load_pem_public_key(text.encode())
    except (ValueError, TypeError):
        raise UserError(f"{path}: not a PEM public key") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp256r1":
        raise UserError(f"{path}: not an ECDSA P-256 public key")
    return PublicKey(path, key)


def _read(path: Path, what: str) -> str:
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_KEY_FILE + 1)
    except OSError as error:
        raise UserError(f"{path}: cannot read the {what} ({error.strerror})") from None
    if len(data) > MAX_KEY_FILE:
        raise UserError(f"{path}: too large for a {what}")
    try:
        return data.decode("ascii")
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a PEM {what}") from None


def _pem_label(text: str) -> str | None:
    for line in text.splitlines():
        if line.startswith("-----BEGIN ") and line.endswith("-----"):
            return line.removeprefix("-----BEGIN ").removesuffix("-----")
    return None


def _pem_body(path: Path, text: str) -> bytes:
    lines = text.strip().splitlines()
    try:
        end = next(i for i, line in enumerate(lines) if line.startswith("-----END "))
        start = next(i for i, line in enumerate(lines) if line.startswith("-----BEGIN "))
        return base64.b64decode("".join(lines[start + 1 : end]), validate=True)
    except (StopIteration, binascii.Error):
        raise UserError(f"{path}: a malformed PEM block") from None


def _password(path: Path) -> bytes:
    for name in PASSWORD_VARIABLES:
        if name in os.environ:
            remember(os.environ[name])  # masked in every line and record from now on
            return os.environ[name].encode()
    raise UserError(f"{path} is encrypted: set BSI_SIGN_PASSWORD (or COSIGN_PASSWORD)")


def _decrypted(path: Path, body: bytes, password: bytes) -> bytes:
    """The PKCS#8 DER inside cosign's envelope: scrypt derives the secretbox key."""
    try:
        envelope = json.loads(body)
        kdf, cipher = envelope["kdf"], envelope["cipher"]
        params = kdf["params"]
        n, r, p = int(params["N"]), int(params["r"]), int(params["p"])
        salt = base64.b64decode(kdf["salt"])
        nonce = base64.b64decode(cipher["nonce"])
        ciphertext = base64.b64decode(envelope["ciphertext"])
        names = (kdf["name"], cipher["name"])
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise UserError(f"{path}: a malformed encrypted key") from None
    if names != ("scrypt", "nacl/secretbox"):
        raise UserError(f"{path}: unknown key encryption {'/'.join(map(str, names))}")
    if 128 * r * n > MAX_SCRYPT_MEMORY:
        raise UserError(f"{path}: its scrypt parameters ask for more than 1 GiB")
    try:
        secret = hashlib.scrypt(
            password, salt=salt, n=n, r=r, p=p, maxmem=MAX_SCRYPT_MEMORY + (1 << 20), dklen=32
        )
        return nacl.secret.SecretBox(secret).decrypt(ciphertext, nonce)
    except nacl.exceptions.CryptoError:
        raise UserError(f"{path}: wrong passphrase (BSI_SIGN_PASSWORD / COSIGN_PASSWORD)") from None
    except ValueError as error:
        raise UserError(f"{path}: unusable scrypt or secretbox parameters ({error})") from None
