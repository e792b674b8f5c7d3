"""The adversarial checks of verification: what a hostile command in the sandbox tries.

`hardening` (detached processes, floods of output and of requests), `race` (a symlink swapped
while the server resolves a path) and `starve` (connections held open and CPU burnt while the
platform asks the server for its state). Each runs against a `Sandbox` client and raises a
`ContractViolation` naming what broke. May import the contract and verify's client and report.
"""
