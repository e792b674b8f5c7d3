"""The fourth stage: /app/deps-extra as reproducible layers, in the formats nodes read.

`extras` stacks the layers (one per distribution, small ones in buckets), `layer` writes each
tar byte for byte the same from the same wheels, `install_layout` says where `pip install
--target` would put each member, `bytecode` and `interpreter` compile the layer's bytecode with
the base's own CPython, `home` seeds the sandbox user's home, `gzipped` compresses layers the
same on every machine, `first_reads` orders a layer by the first import's reads, and
`lazy_reads` and `soci` make the SOCI index a lazy node reads by. May import the earlier stages,
the cache, the engines and the OCI core; never a later stage or the orchestration.
"""
