"""The served-query windows of the drift check, one per collection, in memory.

Search hands each calibrated query's summary (``calibration.drift.query_summary``)
to :meth:`DriftMonitor.observe`: O(features) under a lock, no I/O. A window belongs
to the calibrator that served it; another calibrator starts a new one, and a
calibrator without judged queries (the shipped default, profiles fitted before drift
references) has none. The verdict search responses carry is recomputed every
:data:`VERDICT_EVERY` queries, so reading it costs nothing; the drift endpoint
measures afresh. Windows live in this process only: a restart starts them afresh.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from app.schemas.collections import DriftStatus
from calibration.drift import DriftReference, DriftVerdict, ServedWindow, compare
from calibration.profile import Profile

VERDICT_EVERY = 16
"""Served queries between two verdicts of the cached one search responses carry."""


@dataclass
class _Served:
    """One collection's window: whose it is, since when, its last verdict."""

    calibrator: str
    window: ServedWindow
    since: float
    verdict: DriftVerdict | None = None
    verdict_at: int = 0  # window.seen when the verdict was computed


@dataclass(frozen=True)
class Measured:
    """A window measured now: its size, its start and the verdict (if it has one)."""

    n_queries: int
    since: float | None
    verdict: DriftVerdict | None


def reference_of(profile: Profile | None) -> DriftReference | None:
    """The judged queries a profile can be compared with (None: nothing to compare)."""
    if profile is None or profile.default:
        return None
    return profile.report.drift_reference


class DriftMonitor:
    """Windows of served queries by collection (module docstring)."""

    def __init__(self, window: int, min_queries: int) -> None:
        self.window = window
        self.min_queries = min_queries
        self._lock = threading.Lock()
        self._served: dict[str, _Served] = {}

    def observe(
        self,
        collection: str,
        profile: Profile | None,
        summaries: Sequence[NDArray[np.float64]],
    ) -> None:
        """Count served queries into the collection's window for ``profile``."""
        reference = reference_of(profile)
        with self._lock:
            if reference is None or profile is None:
                self._served.pop(collection, None)  # no stale verdict to report
                return
            served = self._served.get(collection)
            if served is None or served.calibrator != profile.id:
                served = _Served(
                    profile.id, ServedWindow(reference, self.window), time.time()
                )
                self._served[collection] = served
            for summary in summaries:
                served.window.add(summary)
            if served.verdict is None or served.window.seen >= (
                served.verdict_at + VERDICT_EVERY
            ):
                self._refresh(served)

    def verdict(self, collection: str, profile: Profile | None) -> DriftStatus | None:
        """The cached verdict of ``profile``'s window (None: none yet)."""
        with self._lock:
            served = self._served.get(collection)
            if served is None or profile is None or served.calibrator != profile.id:
                return None
            return _status(served.verdict)

    def measure(self, collection: str, profile: Profile) -> Measured:
        """Measure ``profile``'s window now (empty if another calibrator serves)."""
        with self._lock:
            served = self._served.get(collection)
            if served is None or served.calibrator != profile.id:
                return Measured(0, None, None)
            self._refresh(served)
            return Measured(served.window.n, served.since, served.verdict)

    def forget(self, collection: str) -> None:
        """Drop a collection's window (it was dropped or replaced)."""
        with self._lock:
            self._served.pop(collection, None)

    def samples(self) -> list[tuple[str, bool, dict[str, float]]]:
        """``(collection, drifting, PSI by feature)`` of every cached verdict."""
        with self._lock:
            return [
                (
                    name,
                    s.verdict.drifting,
                    {f.feature: f.psi for f in s.verdict.features},
                )
                for name, s in sorted(self._served.items())
                if s.verdict is not None
            ]

    def _refresh(self, served: _Served) -> None:
        """Recompute the verdict (none below ``min_queries``); the lock is held."""
        window = served.window
        served.verdict_at = window.seen
        served.verdict = (
            compare(window.reference, window.counts(), window.predicted_rate())
            if window.n >= self.min_queries
            else None
        )


def _status(verdict: DriftVerdict | None) -> DriftStatus | None:
    if verdict is None:
        return None
    return "drifting" if verdict.drifting else "ok"
