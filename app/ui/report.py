"""Calibration reports: the reliability diagram (PNG) and the HTML report page.

The page is rendered from ``templates/report.html`` with autoescaping on.
"""

from __future__ import annotations

import io
import math
from typing import Any

import jinja2
import numpy as np

from calibration.metrics import ReliabilityCurve
from calibration.profile import BINNING, Profile

_CONSERVATIVE = (
    "search abstains only when even the upper end of the confidence interval (the "
    "confidence itself without one) is below 0.5, and claims no rate."
)


def reliability_png(profile: Profile) -> bytes:
    """Reliability diagram of the out-of-fold probabilities, plus their histogram."""
    import matplotlib

    matplotlib.use("Agg")  # headless; set before pyplot is imported
    from matplotlib.figure import Figure

    predicted, observed, counts = _bins(profile.report.reliability)
    fig = Figure(figsize=(5.5, 6.0), dpi=100)
    top, bottom = fig.subplots(2, 1, height_ratios=(3, 1), sharex=True)
    top.plot([0, 1], [0, 1], linestyle="--", color="grey", label="perfect calibration")
    sizes = [20 + 180 * c / max(counts) for c in counts] if counts else []
    top.scatter(predicted, observed, s=sizes, color="tab:blue", zorder=3)
    top.plot(
        predicted, observed, color="tab:blue", label=f"{profile.method} (held-out)"
    )
    top.set_ylabel("observed frequency of relevant")
    top.set_ylim(0, 1)
    top.set_title(f"Reliability — calibrator {profile.id} ({profile.method})")
    top.legend(loc="upper left")
    bottom.bar(predicted, counts, width=0.02, color="tab:blue")
    bottom.set_xlabel(f"predicted P(relevant), {BINNING.label}")
    bottom.set_ylabel("pairs")
    bottom.set_xlim(0, 1)
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png")
    return out.getvalue()


def _bins(curve: ReliabilityCurve) -> tuple[list[float], list[float], list[float]]:
    """The curve's points, at most ``BINNING.n_bins`` of them: what is drawn.

    Imported profiles are checked to hold their bins only; a longer curve stored
    before that is merged into ``BINNING.n_bins`` groups (count-weighted), so a
    render never grows with the number of points. Non-finite points are dropped.
    """
    try:
        p = np.asarray(curve.mean_predicted, dtype=np.float64).ravel()
        o = np.asarray(curve.observed_frequency, dtype=np.float64).ravel()
        n = np.asarray(curve.counts, dtype=np.float64).ravel()
    except (TypeError, ValueError):
        return [], [], []
    size = min(len(p), len(o), len(n))
    p, o, n = p[:size], o[:size], n[:size]
    keep = np.isfinite(p) & np.isfinite(o) & np.isfinite(n) & (n >= 0)
    p, o, n = p[keep], o[keep], n[keep]
    if len(p) > BINNING.n_bins:
        groups = np.array_split(np.arange(len(p)), BINNING.n_bins)
        totals = np.array([n[g].sum() for g in groups])
        weights = [n[g] if n[g].sum() > 0 else np.ones(len(g)) for g in groups]
        p = np.array(
            [np.average(p[g], weights=w) for g, w in zip(groups, weights, strict=True)]
        )
        o = np.array(
            [np.average(o[g], weights=w) for g, w in zip(groups, weights, strict=True)]
        )
        n = totals
    return p.tolist(), o.tolist(), n.tolist()


def _num(value: Any, digits: int = 4) -> str:
    """A float to ``digits`` places; "-" for a missing or non-finite one.

    Anything else is shown as its text: the template escapes it like every value.
    """
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


_TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("app.ui", "templates"),
    autoescape=True,  # every value, whatever its type, is escaped
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
_TEMPLATES.filters["num"] = _num


def report_html(
    profile: Profile, png_url: str, collection: str | None, css_url: str
) -> str:
    """A self-contained HTML page of a calibrator's report (no script in it).

    Rendered by an autoescaping Jinja2 template: a report field of an imported
    profile is data, whatever it holds, and is never read as markup.
    """
    r = profile.report
    abstain = r.abstain
    delta = getattr(abstain, "delta", None)
    answered = 1 - delta if isinstance(delta, int | float) else None
    why = r.selection
    return _TEMPLATES.get_template("report.html").render(
        profile=profile,
        r=r,
        why=why,
        recalibrated={} if why is None else why.recalibrated_cv,
        lift=r.norm_lift,
        abstain=abstain,
        answered=answered,
        conservative=_CONSERVATIVE,
        collection=collection,
        png_url=png_url,
        css_url=css_url,
    )
