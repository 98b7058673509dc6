"""Bars reduced to the pixels that show them: what a figure or a screen ``n`` pixels wide can
draw of thousands of bars narrower than a pixel, so that each colour keeps its share of a row.
Drawn one by one such bars each take a whole pixel or none, and the colour drawn last wins a
pixel they share: where ops repeat every pixel or two (a MoE layer's compute and exposed
all-to-alls across a step) the beat between their period and the pixel grid paints bands
hundreds of pixels wide in one colour. The HTML report's timeline
(:mod:`simulator.results.html_timeline`, whose page script does the same in the browser at every
zoom), ``timeline.png`` and ``stepsim compare``'s figure (:mod:`simulator.results.plots`) draw
what :func:`bin_shares` gives.
"""

from __future__ import annotations

import numpy as np


def bin_coverage(groups, n_rows: int, lo: float, hi: float, n_bins: int) -> np.ndarray:
    """Time each group's bars cover in each of ``n_bins`` equal bins of ``[lo, hi]`` on each
    row, in bins: an array ``[row, group, bin]`` of values in [0, 1] (more where a group's bars
    overlap). ``groups``: ``(x0, x1, y)`` arrays per group, ``y`` a row index."""
    acc = np.zeros((n_rows, len(groups), n_bins + 1))
    full = np.zeros_like(acc)  # difference array of the bins a bar covers whole
    w = (hi - lo) / n_bins
    for g, (x0, x1, y) in enumerate(groups):
        a = np.clip((np.asarray(x0, dtype=float) - lo) / w, 0, n_bins)
        b = np.clip((np.asarray(x1, dtype=float) - lo) / w, 0, n_bins)
        keep = b > a
        a, b, y = a[keep], b[keep], np.asarray(y, dtype=np.int64)[keep]
        ia, ib = np.floor(a).astype(np.int64), np.floor(b).astype(np.int64)
        one = ia == ib
        np.add.at(acc, (y[one], g, ia[one]), b[one] - a[one])
        m = ~one
        np.add.at(acc, (y[m], g, ia[m]), ia[m] + 1 - a[m])
        np.add.at(acc, (y[m], g, ib[m]), b[m] - ib[m])
        np.add.at(full, (y[m], g, ia[m] + 1), 1.0)
        np.add.at(full, (y[m], g, ib[m]), -1.0)
    return (acc + np.cumsum(full, axis=2))[:, :, :n_bins]


#: Heights a row's bar is cut into where several colours share a pixel (:func:`bin_shares`).
SHARE_LEVELS = 16


def bin_shares(groups, n_rows: int, lo: float, hi: float, n_bins: int, levels: int = SHARE_LEVELS) -> list:
    """What a picture ``n_bins`` pixels wide can show of the bars of ``groups`` between ``lo`` and
    ``hi`` without colours that are not in its legend: each pixel's bar cut in height by the
    share of the pixel each group covers (in ``levels`` steps, groups stacked from the bottom in
    their order, the uncovered share left empty at the top), so that a run of ops shorter than a
    pixel shows its mix (28 % exposed communication as a band 28 % high) and a row that is busy a
    third of the time shows a bar a third high; a bar wider than a pixel is drawn full height to
    a pixel at each end. Pieces of one group and height next to each other are one. Returns per
    group ``(x0, x1, y, b0, b1)``: each piece's time span, row and bottom and top as shares of
    the bar's height (``0 <= b0 < b1 <= 1``)."""
    n_bins = max(1, int(n_bins))
    level = np.rint(np.clip(bin_coverage(groups, n_rows, lo, hi, n_bins), 0.0, 1.0) * levels).astype(np.int64)
    top = np.minimum(np.cumsum(level, axis=1), levels)
    bottom = np.concatenate([np.zeros_like(top[:, :1]), top[:, :-1]], axis=1)
    w = (hi - lo) / n_bins
    out = []
    for g in range(len(groups)):
        key = np.full((n_rows, n_bins + 2), -1, dtype=np.int64)
        b0, b1 = bottom[:, g], top[:, g]
        key[:, 1:-1] = np.where(b1 > b0, b0 * (levels + 1) + b1, -1)
        r, at = np.nonzero(key[:, 1:] != key[:, :-1])  # where a row's piece changes, in row order
        same = r[:-1] == r[1:]
        r, s, e = r[:-1][same], at[:-1][same], at[1:][same]
        k = key[r, s + 1]
        on = k >= 0
        r, s, e, k = r[on], s[on], e[on], k[on]
        out.append((lo + s * w, lo + e * w, r.astype(float), (k // (levels + 1)) / levels, (k % (levels + 1)) / levels))
    return out


def piece_span(y, b0, b1, half: float = 0.4) -> tuple:
    """The data coordinates ``(top, bottom)`` of pieces from :func:`bin_shares` on a timeline
    whose rows are ``2 half`` high at row index ``y`` and whose y axis is inverted (row 0 at the
    top, as both timelines draw it): a piece's share ``b0`` is measured up from the row's bottom,
    ``y + half``."""
    return y + half - 2 * half * b1, y + half - 2 * half * b0
