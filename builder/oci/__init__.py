"""The OCI core: image references, image values, and one way to read and write them.

In the spirit of go-containerregistry's `name` / `v1` / `mutate` / `remote`:

- `name`: `ImageRef`, a reference parsed once by Docker's normalization rules;
- `v1`: media types, canonical JSON, digests, `Platform` (the one variant rule and the
  x86_64/aarch64 mapping), `Descriptor`, `Image` and `Index` (exact bytes, digest, fields),
  and `Index.pick`, the one function choosing a platform's entry;
- `mutate`: pure functions from images to images (append layers, set the config, take the
  layers one image adds over another);
- `auth`: `Credentials` as a value and where a login may be sent (builder.credentials looks
  them up; the core never reads a Docker config);
- `client`: `RepositoryClient`, the distribution API's primitives for one repository, verified and
  bounded reads, typed errors;
- `transport`: the one loop every request of a client goes through, tried as the one retry
  policy says (builder.retry: what is tried again, the backoff, `Retry-After`, a run's
  budget and record; shared with the package index's downloads);
- `remote`: `resolve(registry, platform)` and `write(registry, images, blobs, index, tags)`,
  the only reader of a platform's image and the only writer of blobs, manifests and tags;
- `referrers`: what is attached to an image (an `Artifact`), and finding it again;
- `ztoc`, `ztoc_read`: SOCI ztocs and the SOCI index as soci-snapshotter 0.4 reads them, written
  from a gzip layer and read back against one.

The core imports nothing of the project but builder.errors and builder.retry
(tests/test_layout.py holds it to that), so every stage, the base, the signing and the
orchestration stand on it.
"""
