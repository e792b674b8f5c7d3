"""A fault-injecting HTTP proxy in front of the real local registry, for the tests of a bad day.

`FaultProxy(upstream, plan)` listens on a loopback port and forwards each request to the
registry (the Host header passed through, so upload Locations point back at the proxy), except
those `plan` says to fail. Faults, by kind:

- `500`, `502`, `503`: that status, the registry not asked;
- `429`: 429 with `Retry-After: <plan.retry_after>`, the registry not asked;
- `drop-before`: the connection closed without an answer, the registry not asked;
- `drop-after`: the registry asked and answered, the connection closed without the answer (an
  upload's bytes taken, the client told nothing: the common case);
- `cut`: the registry's answer with its full Content-Length but half its body, then closed
  (a HEAD or an empty body: as `drop-after`);
- `trickle`: the registry's answer, its body sent `plan.trickle` bytes at a time with
  `plan.trickle_every` seconds between them (each piece well within a read's timeout), until
  the client goes away.

Which requests fail is deterministic: a request is known by its method and path (query
dropped), and `random.Random(f"{seed}:{method} {path}")` decides once whether it fails its
first try, its first two, or none, and how. `rules` force a fault on the first requests
matching a pattern (the first GET of the base's manifest, say); `down_after` makes every
request after the first matching one a 503 (a registry that goes down midway); `read_rate`
reads every request's body at that many bytes a second, as a slow uplink delivers it. Only
requests whose User-Agent starts with `plan.agent` are faulted (the tool's urllib; the engine's
own pulls go through clean). Request bodies must carry a Content-Length (the tool's do; the
engine's chunked pushes go to the registry itself). `log` records every request: its time,
method, path, what was done, the status answered and the User-Agent.
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import random
import re
import socket
import threading
import time
from dataclasses import dataclass, field

KINDS = ("500", "502", "503", "429", "drop-before", "drop-after", "cut")  # what a draw picks
TRICKLE = "trickle"  # only where a rule asks: a trickle lasts as long as the client waits
CHUNK = 1 << 20


@dataclass(frozen=True)
class Rule:
    """Fail the first `times` requests whose `METHOD path` matches `pattern` with `kind`."""

    pattern: str
    kind: str
    times: int = 1


@dataclass
class Plan:
    """What the proxy does to the tool's requests."""

    seed: int = 0
    once: float = 0.0  # share of requests failing their first try
    twice: float = 0.0  # share failing their first two
    kinds: tuple[str, ...] = KINDS
    retry_after: int = 1  # seconds, in a 429's Retry-After
    rules: tuple[Rule, ...] = ()
    down_after: str | None = None  # a pattern: after its first match, every request is a 503
    agent: str = "Python-urllib"
    trickle: int = 16  # bytes a `trickle` sends at a time
    trickle_every: float = 0.1  # seconds between them
    read_rate: int = 0  # bytes a second the proxy reads a request's body at (0: at once)


@dataclass(frozen=True)
class Logged:
    at: float  # time.monotonic()
    method: str
    path: str  # with the query
    action: str  # "forward" or a fault kind
    status: int | None  # what the client was answered (None: nothing)
    agent: str  # the User-Agent: the tool's urllib, or the engine


@dataclass
class _State:
    plan: Plan
    failed: dict[str, int] = field(default_factory=dict)  # request key -> faults done
    ruled: dict[int, int] = field(default_factory=dict)  # rule index -> faults done
    down: bool = False
    log: list[Logged] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def decide(self, method: str, path: str, agent: str) -> str | None:
        """The fault for this request (None: forward it), and the bookkeeping."""
        text = f"{method} {path}"
        key = f"{method} {path.split('?', 1)[0]}"
        with self.lock:
            if self.down:
                return "503"
            if self.plan.down_after and re.search(self.plan.down_after, text):
                self.down = True  # this one still goes through: the registry saw it
            if not agent.startswith(self.plan.agent):
                return None
            for number, rule in enumerate(self.plan.rules):
                if re.search(rule.pattern, text) and self.ruled.get(number, 0) < rule.times:
                    self.ruled[number] = self.ruled.get(number, 0) + 1
                    return rule.kind
            draw = random.Random(f"{self.plan.seed}:{key}")
            chance = draw.random()
            kind = draw.choice(self.plan.kinds)
            count = 1 if chance < self.plan.once else 0
            count = 2 if self.plan.once <= chance < self.plan.once + self.plan.twice else count
            if self.failed.get(key, 0) < count:
                self.failed[key] = self.failed.get(key, 0) + 1
                return kind
            return None


class _Server(http.server.ThreadingHTTPServer):
    """The listening server, holding what every handler shares: the state and the upstream."""

    daemon_threads = True

    def __init__(self, state: _State, upstream: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.state = state
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))


class _Handler(http.server.BaseHTTPRequestHandler):
    """One request: read, decide its fault, then answer it, forward it or both, as decided."""

    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, *args: object) -> None:
        pass

    def record(self, action: str, status: int | None) -> None:
        agent = self.headers.get("User-Agent", "")
        one = Logged(time.monotonic(), self.command, self.path, action, status, agent)
        with self.server.state.lock:
            self.server.state.log.append(one)

    def drop(self, action: str) -> None:
        self.record(action, None)
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def read_body(self, length: int, rate: int) -> bytes:
        """The request's body, read at `rate` bytes a second (a slow uplink)."""
        if not rate:
            return self.rfile.read(length) if length else b""
        pieces, got, step = [], 0, CHUNK >> 4
        while got < length:
            pieces.append(self.rfile.read(min(step, length - got)))
            got += len(pieces[-1])
            time.sleep(len(pieces[-1]) / rate)
        return b"".join(pieces)

    def answer(self) -> None:
        """Read the request, then fail it without the registry, or forward it (maybe faulted)."""
        state = self.server.state
        length = int(self.headers.get("Content-Length") or 0)
        body = self.read_body(length, state.plan.read_rate)
        kind = state.decide(self.command, self.path, self.headers.get("User-Agent", ""))
        if kind == "drop-before":
            return self.drop(kind)
        if kind in ("500", "502", "503", "429"):
            return self.fail(int(kind))
        return self.forward(body, kind)

    def fail(self, status: int) -> None:
        """Answer `status` with an empty body, the registry not asked (a 429 says when to retry)."""
        self.send_response(status)
        if status == 429:
            self.send_header("Retry-After", str(self.server.state.plan.retry_after))
        self.send_header("Content-Length", "0")
        self.end_headers()
        self.record(str(status), status)

    def ask_upstream(self, body: bytes) -> http.client.HTTPConnection:
        """The request sent on to the registry as it came (its Host kept), the connection open."""
        connection = http.client.HTTPConnection(*self.server.upstream, timeout=120)
        connection.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
        for name, value in self.headers.items():  # repeated ones (Accept) each sent
            if name.lower() != "connection":
                connection.putheader(name, value)
        connection.endheaders(body or None)
        return connection

    def send_head(self, response: http.client.HTTPResponse) -> None:
        """The registry's status and headers, passed on (always with a Content-Length)."""
        self.send_response(response.status)
        for name, value in response.getheaders():
            if name.lower() not in ("connection", "transfer-encoding"):
                self.send_header(name, value)
        if "Content-Length" not in dict(response.getheaders()):
            self.send_header("Content-Length", "0")
        self.end_headers()

    def send_body(self, response: http.client.HTTPResponse, limit: int, kind: str | None) -> bool:
        """Up to `limit` bytes of the registry's body passed on, a trickle's slowly.

        False when the client went away before the end (as it does, sooner or later, on a trickle).
        """
        plan = self.server.state.plan
        piece = plan.trickle if kind == TRICKLE else CHUNK
        sent = 0
        while self.command != "HEAD" and sent < limit:
            if kind == TRICKLE and sent:
                time.sleep(plan.trickle_every)
            chunk = response.read(min(piece, limit - sent))
            if not chunk:
                break
            try:
                self.wfile.write(chunk)
                self.wfile.flush()
            except OSError:
                return False
            sent += len(chunk)
        return True

    def forward(self, body: bytes, kind: str | None) -> None:
        """Ask the registry, then pass its answer on: whole, cut, trickled, or not at all."""
        connection = self.ask_upstream(body)
        try:
            response = connection.getresponse()
            size = int(response.getheader("Content-Length") or 0)
            if kind == "drop-after" or (kind == "cut" and (self.command == "HEAD" or not size)):
                response.read()
                return self.drop("drop-after")
            self.send_head(response)
            whole = self.send_body(response, size // 2 if kind == "cut" else size, kind)
        finally:
            connection.close()
        if not whole:
            return self.record(kind or "forward", None)
        if kind == "cut":
            self.wfile.flush()
            return self.drop("cut")
        return self.record(kind or "forward", response.status)

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = answer


class FaultProxy:
    """A loopback proxy to `upstream` (`host:port`) failing requests as `plan` says."""

    def __init__(self, upstream: str, plan: Plan | None = None) -> None:
        self.state = _State(plan or Plan())
        self.httpd = _Server(self.state, upstream)
        self.port = self.httpd.server_address[1]
        self.host = f"127.0.0.1:{self.port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def log(self) -> list[Logged]:
        with self.state.lock:
            return list(self.state.log)

    def replan(self, plan: Plan) -> None:
        """Fail as `plan` says from now on (its counts start afresh; the log is kept)."""
        with self.state.lock:
            self.state.plan, self.state.failed, self.state.ruled = plan, {}, {}
            self.state.down = False

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
