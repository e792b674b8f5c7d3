"""What a base image is: its facts (python, glibc, /app/deps, libraries, user, PYTHONPATH).

Read through the engine (`probe`) or through its registry without one (`registry`), both turned
into one `BaseProfile` by `profile`. May import the resolve, inspect and plan stages (the profile is
their input), the registry client and references; never a later stage (tests/test_layout.py).
"""
