"""Domain exceptions of the calibration package.

The service maps these to HTTP problem responses in one table, so every message is
written for the person who sent the data, and every error carries structured fields.

Hierarchy::

    CalibrationError (Exception)
    ├── InvalidInputError (+ ValueError)        bad shapes, NaN/inf, bad values -> 422
    ├── CalibrationFitError                     a fit could not be done -> 422
    │   ├── InsufficientDataError               too few queries / pairs -> 422
    │   │   └── SingleClassError                labels are all 0 or all 1 -> 422
    │   └── ConvergenceError                    optimiser failed -> 500-class
    ├── NotFittedCalibratorError (+ sklearn NotFittedError)  used before fit -> 409
    └── UnsupportedFormatError (+ ValueError)   bad persisted JSON -> 400/422

``NotFittedCalibratorError`` also subclasses scikit-learn's ``NotFittedError`` (itself a
``ValueError`` and ``AttributeError``), so generic estimator tooling keeps working.
"""

from __future__ import annotations

from sklearn.exceptions import NotFittedError

__all__ = [
    "CalibrationError",
    "CalibrationFitError",
    "ConvergenceError",
    "InsufficientDataError",
    "InvalidInputError",
    "NotFittedCalibratorError",
    "SingleClassError",
    "UnsupportedFormatError",
]


class CalibrationError(Exception):
    """Base class of every error raised by :mod:`calibration`."""


class InvalidInputError(CalibrationError, ValueError):
    """Input arrays are malformed (shape, NaN/inf, out-of-range values).

    Parameters
    ----------
    message : str
        User-readable description.
    field : str or None, default=None
        Name of the offending argument (e.g. ``"X"``, ``"norms"``).
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class CalibrationFitError(CalibrationError):
    """A calibrator could not be fitted on the given data."""


class InsufficientDataError(CalibrationFitError):
    """Too little labelled data for the requested operation.

    Parameters
    ----------
    message : str
        User-readable description.
    n_queries : int or None, default=None
        Number of distinct labelled queries received.
    required : int or None, default=None
        Minimum number of queries the operation needs.
    n_pairs : int or None, default=None
        Number of labelled (query, hit) pairs received.
    """

    def __init__(
        self,
        message: str,
        *,
        n_queries: int | None = None,
        required: int | None = None,
        n_pairs: int | None = None,
    ) -> None:
        super().__init__(message)
        self.n_queries = n_queries
        self.required = required
        self.n_pairs = n_pairs


class SingleClassError(InsufficientDataError):
    """All labels are the same class, so no probability map can be learned.

    Parameters
    ----------
    message : str
        User-readable description.
    label : int
        The only label present.
    n_pairs : int or None, default=None
        Number of labelled pairs received.
    """

    def __init__(self, message: str, *, label: int, n_pairs: int | None = None) -> None:
        super().__init__(message, n_pairs=n_pairs)
        self.label = label


class ConvergenceError(CalibrationFitError):
    """The numerical optimiser failed; ``optimizer_message`` quotes scipy."""

    def __init__(self, message: str, *, optimizer_message: str = "") -> None:
        super().__init__(message)
        self.optimizer_message = optimizer_message


class NotFittedCalibratorError(CalibrationError, NotFittedError):  # type: ignore[misc]
    """A calibrator, reference or policy was used before ``fit``."""


FORMAT_VERSION = 1
"""Version of the JSON payloads of ``calibration.io`` (what this error refers to)."""


class UnsupportedFormatError(CalibrationError, ValueError):
    """A persisted payload has an unknown format version, class or layout.

    Parameters
    ----------
    message : str
        User-readable description.
    format_version : object, default=None
        The version found in the payload, if any.
    class_name : object, default=None
        The class name found in the payload, if any.
    field : str or None, default=None
        Path of the offending value in the payload (e.g. ``"report.fields.cv"``),
        when one value is at fault.
    """

    def __init__(
        self,
        message: str,
        *,
        format_version: object = None,
        class_name: object = None,
        field: str | None = None,
    ) -> None:
        super().__init__(message)
        self.format_version = format_version
        self.class_name = class_name
        self.field = field
