"""Helpers shared by the test modules: servers, fakes, wheel and image factories, CLI runners.

Test modules import from here (``from support.registryhelp import ...``) and never from each
other; fixtures that several modules share live in ``tests/conftest.py``.
"""
