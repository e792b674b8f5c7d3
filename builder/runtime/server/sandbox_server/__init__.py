"""Sandbox runtime server: the HTTP contract every sandbox image serves (port 8888).

Standard library only, started as ``python3 -I /opt/sandbox/server`` (see ``builder.runtime``
for why a package directory): isolated mode keeps /app/deps and /app/deps-extra (on PYTHONPATH)
from shadowing the server's own modules, while the commands it runs still inherit PYTHONPATH
from its environment.

Routes: ``GET /`` health, ``POST /execute``, ``POST /upload`` (multipart, field ``file`` whose
filename is the destination), ``GET /download/{path}``, ``GET /list/{path}``,
``GET /exists/{path}``, ``DELETE /files/{path}``. Paths are percent-decoded exactly once and must
stay inside the workspace, symlinks included.

Read top-down: ``main`` starts the ``app``, whose server admits connections (``admission``),
frames their requests (``protocol``) and acts on them by running commands (``execution``) or on
the workspace (``files``). As in ``http.server``, the protocol is kept apart from the
application.

  main        start-up: the flags, the home, signals, the reaper thread
  flags       the command line, each flag defaulting to a ``SANDBOX_*`` variable
  config      limits and defaults fixed at start-up, and the sizes every module shares
  errors      client-visible failures, each answered as JSON
  health      whether a new command could run now: the ``status`` of ``GET /``
  app         the routes, and the server that holds the workspace, supervisor and limits
  admission/  who is served and how much at once: sources, listener, gate, limits
  protocol/   HTTP/1.1 request framing and multipart forms
  execution/  running a command: commands, output, supervisor, stopping
  files/      the workspace's paths through descriptors, and the user's home

Hardening (the commands run as the same user as the server and may race it):

* Paths are resolved through directory descriptors, never by name after a check
  (``files.paths``).
* Process supervision (``execution.supervisor``): every process a command starts is killed when
  it exits or times out; ``setsid``, double forks and new sessions do not escape. Each starts
  with ``oom_score_adj`` 1000, so under a memory limit the kernel kills a command, not the
  server (which keeps its own score).
* The server is not dumpable, so its commands, though they share its uid, cannot ptrace it nor
  write its /proc files (its ``oom_score_adj``, its memory); a stop signal from a command is
  ignored (``execution.stopping``).
* Memory (``execution.output``, ``execution.commands``): command output is spooled to unnamed
  temporary files (``--spool-dir``, default ``$TMPDIR`` or /tmp, never the workspace; a memfd
  when no directory is writable), each stream capped at ``--max-output`` raw bytes, and the
  JSON reply is encoded and streamed in chunks, each stream capped at half of ``--max-reply``
  encoded bytes (``"truncated"`` says which were cut). At most ``--max-executes`` commands run
  at once, ``--max-queued`` more wait; beyond that: 429 with ``Retry-After``.
* Requests (``admission.listener``, ``protocol.framing``): at most ``--max-connections``
  connections are served at once, headers must arrive within ``--header-timeout`` seconds and
  a body within ``--body-timeout``; every malformed request is answered with a 4xx JSON error.
  Uploads may come as a chunked body (the upstream SDK streams file objects so), bounded by
  ``--max-upload`` and the body deadline too.
* Sources (``admission``): one client address holds at most
  ``--max-connections-per-source`` connections and ``--max-executes-per-source`` commands
  (running or waiting); every address of this host, loopback included, is one source, so the
  sandbox's own code cannot take the platform's share. A connection over a bound gets no
  thread: the gate answers its ``GET /`` with the server's health (``ok`` only when a new
  command could run: a connection and a command slot or queue place free, the process limit
  not reached, a spool file to be had; else 503 with the reason) and anything else with 503 and
  ``Retry-After``; an ``/execute`` over its source's share gets 503 and ``Retry-After`` too.
"""
