"""Turning a plan into an image and putting it where the cluster pulls from.

Render the build context, build it with BuildKit, assemble and rebase the extras layers, push by
digest, point the SandboxTemplate, read what an image holds and what is attached to it (its
SBOM and provenance: `attachments`; its SOCI index for lazy nodes: `soci`, over the layers laid
out for the first import, `first_reads`), and the reference base's own context. May import
`builder.analysis` (the plan it renders), the OCI core, the engines and `builder.attest`; never
`builder.verify` or the orchestration (the orchestration decides whether to push).
"""
