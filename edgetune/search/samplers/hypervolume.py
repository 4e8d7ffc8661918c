"""Two-objective hypervolume: the front a search measured, and how much a new point would add to it.

The ``pareto`` objective wants the whole time-energy front under the budget, not its two ends. So the guided
sampler scores a candidate by the hypervolume its predicted point is expected to add to the measured front
(expected hypervolume improvement, EHVI), estimated over a fixed set of draws from the model's predictive
distribution (:func:`expected_improvement`). Both objectives are minimised, in log space (the model's errors
are relative), and the reference point is the front's own (:func:`reference_point`): per objective the larger
of 1.1 x the nadir and 1.25 x the ideal, the common convention that lets the front's end points count and
gives a front of one point an area.

Pure functions of arrays.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "IDEAL_FACTOR",
    "NADIR_FACTOR",
    "expected_improvement",
    "front",
    "hypervolume",
    "improvement",
    "reference_point",
]

#: the reference point is at least this factor times the front's nadir in each objective ...
NADIR_FACTOR = 1.1
#: ... and at least this factor times its ideal: a point this much worse than the best in either objective
#: adds nothing
IDEAL_FACTOR = 1.25
_CHUNK = 2048  # candidates per block of the vectorised improvement (bounds the memory of draws x segments)


def front(points: np.ndarray) -> np.ndarray:
    """The non-dominated rows of ``points`` (shape ``(n, 2)``, both minimised), sorted by the first column."""
    pts = np.asarray(points, dtype=float).reshape(-1, 2)
    pts = pts[np.all(np.isfinite(pts), axis=1)]
    if pts.size == 0:
        return pts
    pts = pts[np.lexsort((pts[:, 1], pts[:, 0]))]
    keep = pts[:, 1] < np.minimum.accumulate(np.concatenate([[np.inf], pts[:-1, 1]]))
    return pts[keep]


def reference_point(log_front: np.ndarray) -> np.ndarray:
    """The reference point of a front given in log space, in log space (module docs)."""
    f = np.asarray(log_front, dtype=float).reshape(-1, 2)
    if f.size == 0:
        raise ValueError("an empty front has no reference point")
    return np.maximum(f.max(axis=0) + math.log(NADIR_FACTOR), f.min(axis=0) + math.log(IDEAL_FACTOR))


def _segments(pareto: np.ndarray, ref: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The front's staircase as segments of the first objective, ``[lo, hi)``, each with the height ``h`` of
    the front over it (the reference's second coordinate left of the front's first point)."""
    f = front(pareto)
    f = f[(f[:, 0] < ref[0]) & (f[:, 1] < ref[1])]
    lo = np.concatenate([[-np.inf], f[:, 0]])
    hi = np.concatenate([f[:, 0], [ref[0]]])
    h = np.concatenate([[ref[1]], f[:, 1]])
    return lo, hi, h


def hypervolume(pareto: np.ndarray, ref: np.ndarray) -> float:
    """The area ``pareto``'s points dominate, bounded by ``ref`` (points not better than it in both add
    nothing)."""
    lo, hi, h = _segments(pareto, np.asarray(ref, dtype=float))
    return float(np.sum((hi[1:] - lo[1:]) * (ref[1] - h[1:])))


def improvement(x: np.ndarray, y: np.ndarray, pareto: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """The hypervolume each point ``(x, y)`` adds to ``pareto`` (any matching shapes), bounded by ``ref``:
    the area between the point, the reference and the front's staircase."""
    ref = np.asarray(ref, dtype=float)
    lo, hi, h = _segments(pareto, ref)
    x = np.asarray(x, dtype=float)[..., None]
    y = np.asarray(y, dtype=float)[..., None]
    width = np.clip(hi - np.maximum(lo, x), 0.0, None)
    height = np.clip(h - y, 0.0, None)
    return np.nan_to_num(np.sum(width * height, axis=-1), nan=0.0)


def expected_improvement(x: np.ndarray, y: np.ndarray, feasible: np.ndarray, pareto: np.ndarray,
                         ref: np.ndarray) -> np.ndarray:
    """Expected hypervolume improvement of candidates, estimated over draws of their predicted points.

    Args:
        x, y: each candidate's point in each draw from its predictive distribution, shape ``(n, s)``. Draw the
            same standard normals for every candidate (common random numbers): candidates then compare without
            sampling noise between them, and the result is reproducible.
        feasible: whether the candidate holds the constraint in that draw, shape ``(n, s)`` (a draw that does
            not adds nothing).
        pareto: the measured front, shape ``(k, 2)``; ref: the reference point, shape ``(2,)``.

    Returns:
        The mean over the draws of the improvement, shape ``(n,)``.
    """
    x = np.asarray(x, dtype=float)
    out = np.empty(x.shape[0])
    for start in range(0, x.shape[0], _CHUNK):
        sl = slice(start, start + _CHUNK)
        out[sl] = np.mean(improvement(x[sl], y[sl], pareto, ref) * feasible[sl], axis=1)
    return out
