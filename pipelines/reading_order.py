"""Reading order: `reading_order` orders a page's regions: headers first and footers last,
the rest by columns, left to right and top to bottom within a column, a region spanning the
columns (a title, a wide figure) breaking them.
"""

from __future__ import annotations

from gravityocr.pipelines.regions import Region


def _spans(intervals: list[tuple[int, int]], tolerance: int) -> list[tuple[int, int]]:
    """Union of intervals, those overlapping by at most `tolerance` kept apart."""
    merged: list[list[int]] = []
    for start, end in sorted(intervals):
        if merged and start < merged[-1][1] - tolerance:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [tuple(m) for m in merged]


def _gaps(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    return [(a[1], b[0]) for a, b in zip(spans, spans[1:])]


def _split(regions: list[Region], axis: int, tolerance: int) -> list[list[Region]]:
    """Group regions into bands along `axis` (0: columns by x, 1: strips by y)."""
    spans = _spans([(r.bbox[axis], r.bbox[axis + 2]) for r in regions], tolerance)
    groups: list[list[Region]] = [[] for _ in spans]
    for region in regions:
        centre = (region.bbox[axis] + region.bbox[axis + 2]) / 2
        index = next((i for i, (a, b) in enumerate(spans) if a - tolerance <= centre <= b + tolerance), len(spans) - 1)
        groups[index].append(region)
    return [g for g in groups if g]


def _column_gaps(regions: list[Region], tolerance: int) -> list[tuple[int, int]]:
    return _gaps(_spans([(r.bbox[0], r.bbox[2]) for r in regions], tolerance))


def _starts_a_section(strip: list[Region], below: list[list[Region]], tolerance: int) -> bool:
    """A strip of titles without a gutter of its own, followed by a strip with one."""
    return (all(region.type == "title" for region in strip) and not _column_gaps(strip, tolerance)
            and bool(below) and bool(_column_gaps(below[0], tolerance)))


def _order(regions: list[Region], tolerance: int) -> list[Region]:
    if len(regions) <= 1:
        return list(regions)
    strips = _split(regions, 1, tolerance)
    if len(strips) == 1:
        columns = _split(regions, 0, tolerance)
        if len(columns) == 1:  # overlapping boxes: fall back to top-left first
            return sorted(regions, key=lambda r: (r.bbox[1], r.bbox[0]))
        return [r for column in columns for r in _order(column, tolerance)]
    # A strip with a column gutter starts a multi-column band, and the strips after it join
    # the band while a gutter still runs through all of them (a paragraph alone in a strip,
    # beside the other column's gap, stays in its column); a strip with a region across
    # every gutter (a full-width title or figure) breaks the columns. Strips without a
    # gutter of their own before any band (indented items, a term above its description)
    # are read top to bottom. A strip of titles alone, with columns below it again, is a
    # section heading across the page: the columns above it end there.
    bands: list[tuple[list[Region], list[tuple[int, int]]]] = []
    for index, strip in enumerate(strips):
        if bands and bands[-1][1] and not _starts_a_section(strip, strips[index + 1:], tolerance):
            merged = bands[-1][0] + strip
            gaps = _column_gaps(merged, tolerance)
            if gaps:
                bands[-1] = (merged, gaps)
                continue
        bands.append((list(strip), _column_gaps(strip, tolerance)))
    ordered: list[Region] = []
    for band, gaps in bands:
        if len(band) == len(regions):  # one band holding every strip: cut it into its columns
            columns = _split(band, 0, tolerance)
            if len(columns) == 1:
                return sorted(regions, key=lambda r: (r.bbox[1], r.bbox[0]))
            ordered += [r for column in columns for r in _order(column, tolerance)]
        else:
            ordered += _order(band, tolerance)
    return ordered


def reading_order(regions: list[Region], tolerance: int = 2) -> list[Region]:
    """Regions in reading order, `order` set from 0: headers first and footers last, the
    rest by columns (left to right, each top to bottom), full-width regions breaking columns."""
    headers = sorted((r for r in regions if r.type == "header"), key=lambda r: (r.bbox[1], r.bbox[0]))
    footers = sorted((r for r in regions if r.type == "footer"), key=lambda r: (r.bbox[1], r.bbox[0]))
    body = [r for r in regions if r.type not in ("header", "footer")]
    ordered = headers + _order(body, tolerance) + footers
    for index, region in enumerate(ordered):
        region.order = index
    return ordered

