"""Container engines: connecting to one, and which one does each arch's work.

`connection` is one engine (`EngineURL`, `Engine`: a client and how the docker CLI and a
verification reach it; the local engine; image lookup); `per_arch` is the selection
(`--engine ARCH=URL`, the config's [engines]) into `Engines`. May import the arch names of the
resolve stage (`resolve.target`), the OCI core, the credentials, the retry policy, the reporter
and the errors; never a later stage, the base or the orchestration (tests/test_layout.py).
"""
