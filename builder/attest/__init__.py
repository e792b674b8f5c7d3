"""What a security team audits: an image's contents as an SBOM, and how it was built.

Pure: facts in (Debian packages from an image's dpkg status, Python distributions from their
METADATA and the lock, the base, the build's parameters), documents out (a CycloneDX 1.6 SBOM
built with cyclonedx-python-lib, an in-toto statement carrying SLSA provenance v1). Reading the
facts out of an image or a registry, and attaching the documents, is the job of the layers that
touch an engine or a registry (builder.publish.attachments). It may import nothing of the
project but errors and contract; never an engine, a registry, or the orchestration.
"""
