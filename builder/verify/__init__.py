"""Proving an image serves the runtime contract and imports what it should, run hardened.

The contract client, the check suite (runnable against any host:port, so the tests run it
against the server process too), module discovery and the hardened container run. May import
`builder.contract` and the engine client; never `builder.analysis`, `builder.image`.
"""
