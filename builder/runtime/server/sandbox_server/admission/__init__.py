"""Who is served, and how much at once: the bounds on connections and commands, per source.

Modules:

  sources   who a connection comes from (every address of this host is one source), and each
            source's share of a limit
  listener  the accept path: one thread per connection, bounded in all and per source
  gate      connections over a bound, answered without a thread: ``GET /`` with the server's
            health, anything else 503
  limits    commands running and waiting at once, in all and per source
"""
