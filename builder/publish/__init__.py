"""The last stage: what is put where the cluster pulls from, and what is recorded of it.

`publisher` is the act: what the delivery verified, written (each image by digest with its
attachments and SOCI index, the index, the signatures, the tag last), the template pointed and
the state recorded; `node_update` is what a node holding the previous image fetches.
`attachments` makes each arch image's SBOM and provenance from its facts, `tags` names what is
published, `template` points the SandboxTemplate at the pushed digest without disturbing the
operator's YAML, `state` is the record a pipeline commits for the next rebuild, and
`blob_memory` remembers which repositories hold which blobs (so a push mounts rather than
uploads). The registry writes are the OCI core's `remote.write`. May import every earlier stage,
the attestations, the signer and the OCI core; never the orchestration (tests/test_layout.py).
"""
