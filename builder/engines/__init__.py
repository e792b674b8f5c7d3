"""Container engines: connecting to one, and which one does each arch's work.

`connection` is one engine (`EngineURL`, `Engine`: a client and how the docker CLI and a
verification reach it; the local engine; image lookup); `per_arch` is the selection
(`--engine ARCH=URL`, the config's [engines]) into `Engines`. May import the analysis' arch
names, the OCI core, the credentials and the errors; never the image, base, verify or
orchestration layers.
"""
