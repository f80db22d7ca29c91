"""Calibration reports: the reliability diagram (PNG) and the HTML report page."""

from __future__ import annotations

import html
import io
import math
from typing import Any

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


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return html.escape(str(value))


def report_html(profile: Profile, png_url: str, collection: str | None) -> str:
    """A self-contained HTML page of a calibrator's report."""
    r = profile.report
    rows = "\n".join(
        f'<tr class="method{" chosen" if name == profile.method else ""}">'
        f"<td>{html.escape(name)}</td><td>{_fmt(m.nll)}</td>"
        f"<td>{_fmt(m.brier)}</td><td>{_fmt(m.ece)}</td>"
        f"<td>{_fmt(m.auroc, 3)}</td></tr>"
        for name, m in r.cv.items()
    )
    lift = r.norm_lift
    terms = "".join(
        f"<li>{html.escape(k)} = {_fmt(v, 3)} ± {_fmt(sd, 3)}</li>"
        for k, (v, sd) in lift.terms.items()
    )
    evidence = "\n".join(
        f"<tr><td>{html.escape(g.group)}</td><td>{html.escape(g.verdict)}</td>"
        f"<td>{_fmt(g.nll_gain)} ± {_fmt(g.nll_gain_se)}</td>"
        f"<td>{_fmt(g.brier_change)}</td><td>{html.escape(g.reason)}</td></tr>"
        for g in r.evidence_lift or ()
    )
    abstain = r.abstain
    if abstain:
        guarantee = (
            f"Answer when confidence ≥ {_fmt(abstain.threshold, 3)}: with probability "
            f"≥ {_fmt(1 - abstain.delta, 2)}, at most {_fmt(abstain.target_risk, 2)} "
            f"of answered queries have no relevant hit in the top {r.k} "
            f"({abstain.method}, {abstain.n_calibration} held-out queries, "
            f"coverage {_fmt(abstain.coverage, 3)}, empirical risk "
            f"{_fmt(abstain.empirical_risk, 3)})."
            if abstain.certified
            else "No threshold could be certified at this target with these judgments; "
            f"{_CONSERVATIVE}"
        )
    else:
        guarantee = f"No abstain target was requested; {_CONSERVATIVE}"
    where = (
        f"collection <b>{html.escape(collection)}</b>"
        if collection
        else "default profile"
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>normcal calibrator {html.escape(profile.id)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2rem; max-width: 60rem; }}
table {{ border-collapse: collapse; }} td, th {{ border: 1px solid #ccc; padding: .3rem .6rem; }}
tr.chosen {{ font-weight: bold; background: #eef; }}
</style></head>
<body>
<h1>Calibrator {html.escape(profile.id)}</h1>
<p>{where}; model <code>{html.escape(profile.model)}</code>; chosen method
<b id="chosen">{html.escape(profile.method)}</b>; {r.n_queries} judged queries,
{r.n_pairs} pairs (top {r.k}), {r.n_positive} relevant.
{"Probabilities may reorder hits." if profile.reorders_hits else "Probabilities never reorder hits."}</p>
<h2>Reliability (held-out, grouped by query)</h2>
<img id="reliability" src="{html.escape(png_url)}" alt="reliability diagram" width="550"
 onload="this.dataset.naturalWidth = this.naturalWidth">
<h2>Methods ({r.n_splits}-fold grouped cross-validation)</h2>
<table id="methods"><thead><tr><th>method</th><th>NLL</th><th>Brier</th><th>ECE</th>
<th>AUROC</th></tr></thead><tbody>
{rows}
</tbody></table>
<h2>What each kind of evidence bought (held-out)</h2>
<table id="evidence"><thead><tr><th>evidence</th><th>verdict</th>
<th>NLL gain ± SE (nats/pair)</th><th>Brier change</th><th>why</th></tr></thead><tbody>
{evidence or '<tr><td colspan="5">not measured for this calibrator</td></tr>'}
</tbody></table>
<h2>Norm lift</h2>
<p id="norm-lift">{html.escape(lift.reason)}
NLL {_fmt(lift.nll_without)} → {_fmt(lift.nll_with)},
Brier {_fmt(lift.brier_without)} → {_fmt(lift.brier_with)}
(base family {html.escape(lift.base_method)}).</p>
<ul>{terms}</ul>
<h2>Abstain guarantee</h2>
<p id="abstain">{guarantee}</p>
</body></html>
"""
