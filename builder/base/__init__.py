"""What a base image is: its facts (python, glibc, /app/deps, libraries, user, PYTHONPATH).

Read through the engine (`probe`) or through its registry without one (`registry`), both turned
into one `BaseProfile` by `profile`. May import `builder.analysis` (the profile is the analysis
input), the registry client and references; never `builder.image` or `builder.verify`.
"""
