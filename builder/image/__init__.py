"""Turning a plan into an image and putting it where the cluster pulls from.

Render the build context, build it with BuildKit, push by digest, point the SandboxTemplate,
and the reference base's own context. May import `builder.analysis` (the plan it renders) and
the registry client; never `builder.verify` (the pipeline decides whether to push).
"""
