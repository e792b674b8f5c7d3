"""The orchestration: the only code that sequences producers, verification and writes.

`prepare` (requirements in, plan and build context out), the two producers of per-arch images
(`produce_build`: BuildKit and the tool's assembly; `produce_rebase`: the previous extras on a
new base), the one `delivery` (produce, verify every arch, publish through
builder.publish.publisher, report), `commands` (what `build` and `rebuild` do: prepare,
produce, deliver), the `fleet` of rebuilds, `reference_base` (the `base` command's build of the
reference runtime base), `report` (what a delivery records in report.json's `image`) and
`timeline` (when each step ran). May import every layer below it; no layer below imports it
(tests/test_layout.py).
"""

# The fleet's default --jobs: here rather than in `fleet`, because the CLI names it when its
# options are defined, and importing `fleet` imports the whole pipeline.
DEFAULT_JOBS = 2  # two templates at a time: each already runs its arches and downloads at once
