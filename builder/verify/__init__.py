"""Proving an image serves the runtime contract and imports what it should, run hardened.

`client` (the contract's HTTP client, which the tests use too), `checks` (the contract checks,
runnable against any host:port, so the tests run them against the server process as well),
`hardening` (the adversarial ones among them: symlink-swap race, detached processes, flood),
`sdk` (the upstream SDK's round trip), `discovery` (distributions -> modules to import),
`container` (the hardened run) and `run` (`verify_image`, wiring them). May import
`builder.contract`, the engine client and the errors; never `builder.analysis` (the CLI reads
a requirements file and hands verify the distribution names), `builder.image`, `builder.base`
or the orchestration modules (tests/test_layout.py holds it to that).
"""
