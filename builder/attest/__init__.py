"""What a security team audits: an image's contents as an SBOM, and how it was built.

Pure: facts in (Debian packages from an image's dpkg status, Python distributions from their
METADATA and the lock, the base, the build's parameters), documents out (a CycloneDX 1.6 SBOM
built with cyclonedx-python-lib, an in-toto statement carrying SLSA provenance v1). Reading the
facts out of an image or a registry, and attaching the documents, is the job of the layers that
touch an engine or a registry (builder.publish.attachments).

`contents` reads the facts an SBOM lists out of the texts an image holds (dpkg's status, each
METADATA) and keeps credentials out of URLs, `sbom` is the SBOM's values and an SBOM read back
(verify's `sbom` check compares it with the running image), `sbom_render` renders it with
cyclonedx-python-lib (the only module that imports it), and `provenance` writes the in-toto
statement. It may import nothing of the project but errors and contract; never a stage, an
engine, a registry, or the orchestration (tests/test_layout.py).
"""
