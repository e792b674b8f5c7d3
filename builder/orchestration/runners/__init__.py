"""Each arch on a CI runner of its own, one job to publish (issue 46; docs/scale-out.md).

`document`: the plan a runner is handed (PLAN/plan.json, beside the build context) and its id;
`parts`: `part` (one arch from the plan, pushed by digest) and `merge` (every part checked, then
the index, the tag, the signatures, the template and the state). The delivery itself stays
builder.orchestration.commands' to call; the writes are builder.publish.publisher's (a part's
`ByDigest`, a merge's `publish_index`).
"""
