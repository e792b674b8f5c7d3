"""The command line: parse options, call the orchestration, print. No logic lives here.

`app` is the click group and its commands (`main` is the entry point); `summary` formats a plan
and a push, `fleet` a fleet's table, `sbom` the `sbom REF` command, `base` the `base` command,
`verify` the `verify IMAGE` command, `soci` verify's line on an attached SOCI index, `cache` the
`cache` commands and `--cache-max`, `references` the one click type for an image reference,
`shared` the options and the printing reporter several commands use, and `errors` turns every
command's failure into one `error:` line. Only this package and the reporter print. May import
anything; nothing but `python -m builder` imports it. Each command imports the layers it runs
in its body, so `--help` and a command that needs little start fast
(tests/cli/test_lazy_imports.py).
"""
