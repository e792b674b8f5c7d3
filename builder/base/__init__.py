"""What a base image is: its facts (python, glibc, /app/deps, libraries, user, PYTHONPATH).

`probe` reads them through the engine (one short hardened container), `from_registry` through
its registry with no engine (`layers` is an image's merged filesystem, read from its layer tars
as they stream past), and `profile` turns both readers' facts into one `BaseProfile` and judges
it; `discover` finds the facts the best way a run can (engine, else registry, else the shipped
profile) and `platforms` says which arches a base offers. May import the resolve, inspect and
plan stages' values (the profile is their input: `resolve.target`, `inspect.elf`,
`plan.debian`), the cache, the engines, the OCI core and the credentials; never a later stage
or the orchestration (tests/test_layout.py).
"""
