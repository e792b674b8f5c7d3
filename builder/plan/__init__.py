"""The third stage, pure: resolutions and inspections in, the per-arch plan of the image out.

`plan` makes `Plan`/`ArchPlan` (the wheels, the Debian packages, the programs, the checks),
`natives` finds the shared libraries the wheel set needs from the system and the symbol
versions too new for Debian 13, `debian` is Debian 13's knowledge shipped as data (sonames and
programs to packages), `gpu` says which libraries the GPU node provides and which GPU weight
nothing uses, `program_needs` the programs the image must carry, `layering` which
distributions share a layer, and `sizes` what the image weighs. Imports no module that reaches
a process, an engine or a network, transitively; may import the earlier stages' values, the
contract and the errors; never a later stage (tests/test_layout.py).
"""
