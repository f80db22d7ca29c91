"""Which query to judge next: spread over confidence levels, deterministically.

Calibration is pinned down fastest by judgments across the whole range of
confidence, not only the queries the current map is sure about (those tell little
about the level, and nothing about the slope). So the candidates are put into
equal-width confidence bins and the bins are visited in turn, most uncertain first
(the middle bin), then the extremes, then the rest. The turn is the number of
queries judged or skipped so far, so the choice depends only on the stored state:
reloading the page offers the same query.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

from calibration.profile import fit_profile

# The fewest judged queries a fit accepts: its grouped cross-validation needs one
# query per fold (``fit_profile``'s ``n_splits``, which the service leaves at its
# default). Read from the signature so the two cannot drift apart.
FIT_MIN_QUERIES: int = inspect.signature(fit_profile).parameters["n_splits"].default

CONFIDENCE_BINS = 5
# Visiting order of the bins: uncertain middle first, then both ends, then between.
BIN_ORDER = (2, 0, 4, 1, 3)
CANDIDATE_POOL = 64  # candidates scored per request (in source order)


def confidence_bin(confidence: float) -> int:
    """The bin of a confidence in [0, 1] (out-of-range values clip to the ends)."""
    return min(CONFIDENCE_BINS - 1, max(0, int(confidence * CONFIDENCE_BINS)))


def pick(confidences: Sequence[float], turn: int) -> int:
    """Index of the candidate to judge at ``turn`` (candidates in source order).

    The bin is ``BIN_ORDER[turn % 5]``, or the next non-empty one in that order;
    within a bin, the first candidate in source order.
    """
    if not confidences:
        raise ValueError("no candidates")
    bins = [confidence_bin(c) for c in confidences]
    for step in range(len(BIN_ORDER)):
        wanted = BIN_ORDER[(turn + step) % len(BIN_ORDER)]
        first = next((i for i, b in enumerate(bins) if b == wanted), None)
        if first is not None:
            return first
    raise AssertionError("every bin index lies in BIN_ORDER")  # pragma: no cover
