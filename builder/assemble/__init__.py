"""The sixth stage: the engine side, where a context becomes an engine image.

`build` runs BuildKit on the local engine or an arch's own, `assemble` puts the tool's extras
layers on top of the system stage BuildKit built, `apt` builds the apt layer of a rebase,
`saved` and `read_contents` read what an engine image is and holds (its exact config, its
layers, dpkg's status and every METADATA) and `from_engine` turns an engine image into an OCI
image value with where each blob can be had. May import the earlier stages, the engines and the
OCI core; never verify, publish or the orchestration (tests/test_layout.py).
"""
