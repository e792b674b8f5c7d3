"""Pure analysis: requirements -> target -> resolution -> wheels -> plan.

It reads requirement files, asks the package index (through uv and HTTP) and reads wheels; it
never talks to a container engine or an image registry. It may import `builder.cache`,
`builder.errors`, `builder.data` and the reference value `builder.oci.name` (a plan's base,
parsed once), and nothing from the rest of the OCI core, `builder.base`, `builder.image`,
`builder.verify` or the orchestration modules.
"""
