"""`spans_read`: the spans a lazy node fetches for the files a first import reads."""

from __future__ import annotations

from builder.layers.lazy_reads import LayerSpans, spans_read
from builder.oci.ztoc import Checkpoint, FileEntry, Ztoc

SPAN = 100  # uncompressed bytes a span holds, scaled down


def layer(files: dict[str, tuple[int, int] | str], compressed: list[int], size: int) -> LayerSpans:
    """A layer whose spans start at `compressed` offsets (every SPAN bytes of tar) and whose
    files are (offset, size) pairs, another entry type by name, or `hardlink:<target>`."""
    entries = tuple(
        FileEntry(name, "reg", *where)
        if isinstance(where, tuple)
        else FileEntry(name, "hardlink", 0, 0, linkname=where.removeprefix("hardlink:"))
        if where.startswith("hardlink:")
        else FileEntry(name, where, 0, 0)
        for name, where in files.items()
    )
    points = tuple(Checkpoint(at, n * SPAN, b"") for n, at in enumerate(compressed))
    ztoc = Ztoc("0.9", "test", size, len(compressed) * SPAN, entries, SPAN, points, ())
    return LayerSpans(size, ztoc)


LOWER = layer(
    {
        "usr/": "dir",
        "usr/lib/one.so": (10, 50),  # span 0
        "usr/lib/two.so": (70, 20),  # span 0 as well
        "usr/lib/wide.so": (150, 100),  # spans 1 and 2
        "usr/lib/empty": (260, 0),
        "usr/lib/moved": (270, 10),  # span 2
        "app/late.py": (310, 5),  # span 3, the last: to the layer's end
        "app/edge.py": (250, 50),  # ends where span 3 starts: soci asks for span 3 too
        "usr/lib/linked.so": "hardlink:usr/lib/wide.so",
    },
    [10, 40, 90, 130],
    200,
)
UPPER = layer({"usr/lib/two.so": (0, 10), "usr/lib/moved": "dir"}, [10], 25)


def test_a_span_is_fetched_once_however_many_files_it_holds() -> None:
    assert spans_read([LOWER], ["/usr/lib/one.so"]) == 30
    assert spans_read([LOWER], ["/usr/lib/one.so", "/usr/lib/two.so"]) == 30


def test_a_file_across_spans_fetches_each_and_the_last_span_runs_to_the_layers_end() -> None:
    assert spans_read([LOWER], ["/usr/lib/wide.so"]) == (90 - 40) + (130 - 90)
    assert spans_read([LOWER], ["/app/late.py"]) == 200 - 130


def test_the_uppermost_layer_that_lists_a_file_serves_it() -> None:
    assert spans_read([LOWER, UPPER], ["/usr/lib/two.so"]) == 25 - 10  # the upper layer's span
    assert spans_read([LOWER, UPPER], ["/usr/lib/moved"]) == 0  # a directory there now
    assert spans_read([LOWER, UPPER], ["/usr/lib/one.so", "/usr/lib/two.so"]) == 30 + 15


def test_empty_files_unknown_paths_and_directories_cost_nothing() -> None:
    assert spans_read([LOWER], ["/usr/lib/empty", "/nowhere", "/usr"]) == 0
    assert spans_read([LOWER], []) == 0


def test_a_file_ending_where_a_span_starts_takes_that_span_too() -> None:
    """soci 0.4.1 maps a read's exclusive end to the span whose start is at or before it."""
    assert spans_read([LOWER], ["/app/edge.py"]) == (130 - 90) + (200 - 130)


def test_a_hard_link_reads_its_targets_spans_and_each_path_counts_once() -> None:
    assert spans_read([LOWER], ["/usr/lib/linked.so"]) == spans_read([LOWER], ["/usr/lib/wide.so"])
    assert spans_read([LOWER], ["/usr/lib/one.so"] * 1000) == 30
