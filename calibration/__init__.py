"""normcal calibration maths."""

from __future__ import annotations
