"""The first stage: requirement files in, one pinned resolution per arch out.

`requirements` reads pip-style files (nested files, hashes, index options), `target` says what
we build for (CPython 3.13 on Debian 13 per arch, over a base's facts), `uv` runs the resolver
for the target rather than this host, `index` is the package index client (listings, hashed
downloads, sdists built into pure wheels), `stale` says when a pick is older than the index's
newest, `unresolvable` turns uv's failure into one line, `index_options` says which indexes a
run reads (and which PyTorch build it asks uv for), `origins` names the index each pin came
from, and `resolution` holds the values the later stages keep (`RemoteFile`, `LockedPackage`,
`Resolution`) apart from the code that reaches the network. May import the cache, the retry
policy, the errors and the reference value `builder.oci.name`; never a later stage, the engines
or the orchestration (tests/test_layout.py).
"""
