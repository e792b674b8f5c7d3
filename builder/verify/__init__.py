"""Proving an image serves the runtime contract and imports what it should, run hardened.

`client` (the contract's HTTP client, which the tests use too), `checks` (the contract checks,
runnable against any host:port, so the tests run them against the server process as well),
`hardened` (the adversarial ones: symlink-swap race, detached processes, floods, starvation),
`sdk` (the upstream SDK's round trip), `discovery` (distributions -> modules to import),
`deep` (every module of the distributions imported, failures classified by cause against a
permissive run; the curated use checks),
`programs` (the programs the plan says the image runs), `sbom_check` (the attached SBOM against
the image), `container` (the hardened run), `report` (what failed, said once) and `run`
(`verify_image`, wiring them). May import `builder.contract`, the engine connection, the
reference value `builder.oci.name`, the SBOM reader `builder.attest.sbom` (for `sbom_check`)
and the errors; never another stage (the CLI reads a requirements file and hands verify the
distribution names), `builder.base` or the orchestration modules (tests/test_layout.py holds it
to that).
"""
