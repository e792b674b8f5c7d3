"""Signing what the tool pushes, in cosign's format, and checking such signatures.

A cluster that admits only signed images (Kyverno, the sigstore policy-controller, Connaisseur)
reads cosign's classic layout: a `sha256-<hex>.sig` manifest whose layers are simple-signing
payloads with an ECDSA P-256 signature in an annotation, and a `sha256-<hex>.att` manifest whose
layers are DSSE envelopes around in-toto statements. This package loads the operator's key
(`keys`), makes those manifests as values for the OCI core to write (`cosign`), and checks them
again for `verify --key` (`check`). No transparency log is involved: signing works offline.

It may import the OCI core (builder.oci) and the errors, nothing else of the project: the
orchestration decides what is signed and when (after the manifests, before the tags).
"""
