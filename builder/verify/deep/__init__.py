"""Verification that proves use, not only import (issue 49).

`imports`: every module of the requested distributions imported in the hardened image, each
failure classified by cause against a permissive run of the same image; `script`: the in-image
side of that, run by the image's own `python3 -c`; `use`: the curated use checks of
builder/data/use-checks.toml, a library's basic job done in the sandbox.
"""
