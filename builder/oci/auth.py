"""Registry credentials as a value, and the rules for where they may be sent.

The core never looks credentials up (builder.credentials reads the environment and the Docker
config and hands over a `Credentials`); it only decides where a login may go: to the registry's
own origin, and to a token service that is HTTPS (plain HTTP only on loopback).
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

from builder.oci.name import is_loopback

AUTH_HINT = "log in (docker login {host}) or set BSI_REGISTRY_USER/BSI_REGISTRY_PASSWORD"
CLIENT_ID = "build-sandbox-image"
MAX_TOKEN_ANSWER = 1 << 20  # a token service's JSON; tokens are a few KiB


@dataclass(frozen=True)
class Credentials:
    """A login for one registry; `secret` is a password or, with `identity_token`, a token."""

    username: str
    secret: str
    source: str  # where it was found, for messages: an env var, a helper, config.json
    identity_token: bool = False

    def basic(self) -> str:
        """The Basic Authorization header value of this login."""
        pair = f"{self.username}:{self.secret}".encode()
        return "Basic " + base64.b64encode(pair).decode()


def trusted_realm(realm: str) -> bool:
    """May a login go to this token service? HTTPS, or plain HTTP on loopback."""
    parts = urllib.parse.urlsplit(realm)
    return parts.scheme == "https" or (parts.scheme == "http" and is_loopback(parts.netloc))


def token_request(
    realm: str, service: str, scopes: list[str], credentials: Credentials | None
) -> urllib.request.Request:
    """The request for a bearer token: GET with basic auth, or POST an identity token."""
    query = [("service", service)] if service else []
    query += [("scope", scope) for scope in scopes]
    if credentials and credentials.identity_token:
        form = [
            ("grant_type", "refresh_token"),
            ("client_id", CLIENT_ID),
            ("refresh_token", credentials.secret),
            *query,
        ]
        return urllib.request.Request(
            realm, data=urllib.parse.urlencode(form).encode(), method="POST"
        )
    request = urllib.request.Request(f"{realm}?{urllib.parse.urlencode(query, safe=':/,')}")
    if credentials:
        request.add_unredirected_header("Authorization", credentials.basic())
    return request


def token_of(body: bytes) -> str | None:
    """The token in a token service's answer; ValueError when the answer is not JSON."""
    answer = json.loads(body)
    if not isinstance(answer, dict):
        return None
    token = answer.get("token") or answer.get("access_token")
    return token if isinstance(token, str) else None
