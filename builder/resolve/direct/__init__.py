"""Direct requirements: a path, a URL or a git repository named instead of an index project.

`lines` reads the line forms (pure: no file is fetched while a requirements file is checked),
`vcs` resolves a git ref to its commit and exports that commit, `fetch` makes each direct
requirement one wheel in the cache for the resolver, with the `Source` the records name. It
imports the index client (downloads, pure builds) and the requirement set, as the resolver does.
"""
