"""What a lazy node fetches to read given files of an image: the spans of each layer that hold
them, by the layers' ztocs.

A node with soci-snapshotter mounts every indexed layer from its ztoc and, when a file is read,
fetches and inflates each span its bytes lie in, whole (soci 0.4's span manager has no smaller
unit); a layer the index does not name it fetches whole before the mount. So the bytes a first
import costs follow from the files it reads, where the layers put them, and the span offsets:
`spans_read` is that sum, counting each span once however many files it holds. A file is found
as overlayfs finds it: in the uppermost layer that lists it (a file a whiteout hides is not one
the import could read); a hard link reads its target's bytes. The files are counted whole: a
library the loader maps is read only in the pages it touches.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from builder.oci.ztoc import Ztoc


@dataclass(frozen=True)
class LayerSpans:
    """One indexed layer: its compressed size and its ztoc (the file table and span offsets)."""

    size: int
    ztoc: Ztoc


def spans_read(layers: Sequence[LayerSpans], paths: Iterable[str]) -> int:
    """The compressed bytes of the spans a lazy node fetches to read every file of `paths`
    (absolute paths in the image, symlinks resolved) from the indexed `layers` (bottom first).
    A path no layer lists, or one of size 0, costs nothing here."""
    uppermost: dict[str, tuple[int, int, int]] = {}  # name -> (layer, offset, size)
    for number, layer in enumerate(layers):
        for entry in layer.ztoc.files:
            name = _name(entry.name)
            if entry.type == "reg":
                uppermost[name] = (number, entry.offset, entry.size)
            elif entry.type == "hardlink" and (target := uppermost.get(_name(entry.linkname))):
                uppermost[name] = target
            else:  # replaced by a directory or a symlink: the path read is no longer this file
                uppermost.pop(name, None)
    starts = [[point.uncompressed for point in layer.ztoc.checkpoints] for layer in layers]
    touched: set[tuple[int, int]] = set()
    for path in set(paths):
        found = uppermost.get(_name(path))
        if found is None or found[2] == 0 or not starts[found[0]]:
            continue
        number, offset, size = found
        # soci 0.4.1 asks for the spans from the one holding the first byte to the one whose
        # start is at or before the end (exclusive): a file ending where a span starts takes it
        first = max(bisect_right(starts[number], offset) - 1, 0)
        last = max(bisect_right(starts[number], offset + size) - 1, 0)
        touched |= {(number, span) for span in range(first, last + 1)}
    return sum(_span_size(layers[number], span) for number, span in touched)


def _name(path: str) -> str:
    """A path as the ztoc's file table names it: no leading slash or `./`, no trailing slash."""
    return path.removeprefix("./").strip("/")


def _span_size(layer: LayerSpans, span: int) -> int:
    """Compressed bytes of span `span`: to the next checkpoint, the last to the layer's end."""
    points = layer.ztoc.checkpoints
    end = points[span + 1].compressed if span + 1 < len(points) else layer.size
    return end - points[span].compressed
