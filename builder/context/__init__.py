"""The fifth stage: the build context a person can read and BuildKit can build.

`render` writes the Dockerfile (the apt stage, the extras' layers, the home), the locks, the
wheels and report.json into one directory, swapped in whole; `labels` are the OCI annotations
that let a base-aware tool read the image. May import the earlier stages and the contract;
never a later stage or the orchestration (tests/test_layout.py).
"""
