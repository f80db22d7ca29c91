"""The default for other retrievers' lists, validated out of domain (issue 34).

Usage (from the repo root, with ``../shared/data``, ``NORMCAL_SHARED_DATA`` or ``--data``)::

    python -m benchmarks.external_transfer --out benchmarks/out/external.json

On the lists of :mod:`benchmarks.external` (fourteen sets by six simulated retrievers,
each (set, retriever) a domain):

1. **Which evidence earns its place** (the ladder): each group of features added to
   the prior in turn, kept when its leave-one-dataset-out held-out NLL beats the
   features kept so far by more than one standard error of the paired per-query
   difference — the retriever's own scores (``in_gap``), BM25 among the candidates
   (``lex``, ``lex_rel``, ``lex_rank``) against BM25 with a background IDF table,
   the residual query norm, the document length.
2. **Held out twice** (the main table): every (set, retriever) is scored by a prior
   fitted on the *other* sets under the *other* retrievers, whose served level and
   interval width were chosen on those alone (leave-one-dataset-out inside them):
   interval coverage, Brier over a constant at the cell's own base rate, AUROC, and
   nDCG@10 of the lists in the order they came (input) and in the order of the
   probabilities (returned).
3. **Few labels**: that held-out prior refitted on n = 5, 10, 30 judged lists of the
   cell (``PriorCalibrator``, as ``POST .../calibrators`` with ``lists`` does) against
   Platt on the retriever's own scores fitted on the same lists, both scored on the
   cell's other lists.

Everything heavy is cached (:mod:`benchmarks.external`); this part is CPU only.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy.special import expit

from benchmarks.eval_all import CACHE, DATA
from benchmarks.external import EXTERNAL_CACHE, RETRIEVERS, ListSet, load_all
from benchmarks.transfer import SETS
from calibration import (
    NormReference,
    PlattCalibrator,
    PriorCalibrator,
    SingleClassError,
    auroc,
    brier_score,
    fit_prior,
    interval_coverage,
    negative_log_likelihood,
)
from calibration.external import favour_input_order
from calibration.features import FEATURES
from calibration.metrics import paired_nll_gain
from calibration.prior import (
    OFFSET_GRID,
    WIDTH_GRID,
    CrossDomainPrior,
    interval_coverages,
)
from calibration.profile import build_features, single_threaded_blas
from calibration.report import to_jsonable

FloatArray = NDArray[np.float64]
Cell = tuple[str, str]  # (set, retriever)

BASE = ("cosine", "rank", "gap", "len_q", "in_rank")
LEXICAL = ("lex", "lex_rel", "lex_rank")
LADDER: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("the retriever's scores", ("in_gap",)),
    ("BM25 among the candidates", LEXICAL),
    ("residual query norm", ("ell_q",)),
    ("document length", ("len_d",)),
)
SIZES = (5, 10, 30)
MIN_TEST = 5
ORDER_GRID = np.round(np.arange(0.0, 3.0001, 0.05), 2)
"""Weights of the input order (:func:`calibration.external.favour_input_order`) tried."""
NDCG_SLACK = 0.01
"""The returned order's nDCG@10 may fall this far below the input order's."""
NDCG_K = 10
FIT_VERSION = "1"  # bump when fit_prior changes what it fits


@dataclass(frozen=True)
class Domain:
    """One (set, retriever) as calibration pairs.

    ``X`` in ``FEATURES`` order (in-list BM25), ``X_bg`` the same with the background
    BM25 columns; ``raw`` the retriever's own scores; ``offsets`` row ranges of the
    queries; ``gains``/``ideal`` per query for nDCG; ``slots`` each query's rows in
    list order (``-1`` pads) and ``idcg`` its ideal DCG@10 (0: nothing relevant).
    """

    X: FloatArray
    X_bg: FloatArray
    y: FloatArray
    groups: NDArray[np.int64]
    raw: FloatArray
    offsets: NDArray[np.int64]
    gains: list[FloatArray]
    ideal: list[FloatArray]
    queries: NDArray[np.int64]  # each row's query in its set's sample
    slots: NDArray[np.int64]
    idcg: FloatArray


def references(domains: Mapping[Cell, ListSet]) -> tuple[NormReference, NormReference]:
    """Label-free norm references over every list (what the shipped profile keeps)."""
    evidence = [e for d in domains.values() for e in d.evidence]
    query_ref = NormReference().fit(
        np.array([e.norm for e in evidence]), np.array([e.n_tokens for e in evidence])
    )
    doc_ref = NormReference().fit(
        np.concatenate([e.doc_norms for e in evidence]),
        np.concatenate([e.doc_tokens for e in evidence]),
    )
    return query_ref, doc_ref


_DISCOUNT = 1.0 / np.log2(np.arange(2, NDCG_K + 2))


def as_domain(d: ListSet, query_ref: NormReference, doc_ref: NormReference) -> Domain:
    X, groups = build_features(d.evidence, query_ref, doc_ref)
    background = [
        dataclasses.replace(e, lexical=bg)
        for e, bg in zip(d.evidence, d.background, strict=True)
    ]
    X_bg, _ = build_features(background, query_ref, doc_ref)
    y = np.concatenate([e.labels for e in d.evidence if e.labels is not None])
    raw = np.concatenate(
        [e.input_scores for e in d.evidence if e.input_scores is not None]
    )
    sizes = [len(e.scores) for e in d.evidence]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    queries = np.repeat(d.queries, sizes)
    slots = np.full((len(sizes), max(sizes)), -1, dtype=np.int64)
    for q, n in enumerate(sizes):
        slots[q, :n] = np.arange(offsets[q], offsets[q] + n)
    idcg = np.zeros(len(sizes))
    for q, judged in enumerate(d.ideal):
        best = np.sort(np.maximum(judged, 0.0))[::-1][:NDCG_K]
        idcg[q] = float(best @ _DISCOUNT[: best.size])
    return Domain(
        X, X_bg, y, groups, raw, offsets, d.gains, d.ideal, queries, slots, idcg
    )


def ndcg(d: Domain, score: FloatArray | None = None) -> float:
    """Mean nDCG@10 over the judged queries of the lists ordered by ``score``.

    Descending, ties in the list's own order; ``None``: the input order. The ideal
    DCG is over every judged relevance of the query, retrieved or not.
    """
    rank = np.where(d.slots >= 0, np.arange(d.slots.shape[1]), np.inf)
    if score is None:
        key = rank
    else:
        key = np.where(d.slots >= 0, -score[np.maximum(d.slots, 0)], np.inf)
    order = np.lexsort((rank, key), axis=1)[:, :NDCG_K]
    rows = np.take_along_axis(d.slots, order, axis=1)
    gains = np.concatenate([*d.gains, [0.0]])[rows]  # -1 pads read the 0 at the end
    dcg = np.maximum(gains, 0.0) @ _DISCOUNT[: rows.shape[1]]
    judged = d.idcg > 0
    return float(np.mean(dcg[judged] / d.idcg[judged]))


# -- fitting, held out ---------------------------------------------------------------
class Fits:
    """Priors fitted without some sets and retrievers, each fitted once.

    Each fit is also kept on disk (``~/.cache/normcal/external/fits``, keyed by the
    features, the exclusions and a digest of every domain's data), so a study that
    was cut off resumes where it stopped.
    """

    def __init__(
        self, domains: Mapping[Cell, Domain], features: Sequence[str], bg: bool = False
    ) -> None:
        self.domains = domains
        self.features = tuple(features)
        self.bg = bg
        self._cache: dict[tuple[frozenset[str], frozenset[str]], CrossDomainPrior] = {}
        digest = hashlib.sha256(f"{FIT_VERSION}|{self.features}|{bg}".encode())
        for cell in sorted(domains):
            digest.update("/".join(cell).encode())
            digest.update(np.ascontiguousarray(self.X(cell)).tobytes())
            digest.update(np.ascontiguousarray(domains[cell].y).tobytes())
        self._digest = digest.hexdigest()[:16]

    def X(self, cell: Cell) -> FloatArray:
        d = self.domains[cell]
        return d.X_bg if self.bg else d.X

    def without(
        self, sets: frozenset[str], retrievers: frozenset[str]
    ) -> CrossDomainPrior:
        key = (sets, retrievers)
        if key not in self._cache:
            self._cache[key] = self._load_or_fit(sets, retrievers)
        return self._cache[key]

    def _load_or_fit(
        self, sets: frozenset[str], retrievers: frozenset[str]
    ) -> CrossDomainPrior:
        name = hashlib.sha256(
            f"{self._digest}|{sorted(sets)}|{sorted(retrievers)}".encode()
        ).hexdigest()[:20]
        path = EXTERNAL_CACHE / "fits" / f"{name}.json"
        if path.exists():
            return CrossDomainPrior.from_dict(json.loads(path.read_text()))
        train = {
            f"{s}/{r}": (self.X((s, r)), d.y)
            for (s, r), d in self.domains.items()
            if s not in sets and r not in retrievers
        }
        prior = fit_prior(train, features=self.features)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(prior.to_dict()))
        os.replace(tmp, path)
        return prior


def _logits(
    prior: CrossDomainPrior, X: FloatArray
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """A prior's design of ``X``, its zero-label logit at offset 0 and its spread.

    ``predict_proba`` at offset ``o`` is ``expit(z + o)``; ``predict_interval`` at
    width ``w`` is ``expit(z + o -+ w * spread)`` (the level's and slopes' SDs,
    independent, through the design; the t quantile included).
    """
    Z = prior.standardise(X)
    mean, sd = prior.prior_mean_sd()
    z = Z @ mean - prior.point_offset
    spread = np.sqrt(np.square(Z) @ np.square(sd)) * (prior.quantile / prior.width)
    return Z, z, spread


def order_weight(fits: Fits, held: Mapping[Cell, CrossDomainPrior]) -> dict[str, Any]:
    """The weight of the input order, from priors that did not see each cell's retriever.

    The smallest weight on :data:`ORDER_GRID` at which the returned order's nDCG@10
    is at least the input order's minus :data:`NDCG_SLACK` on every cell at once
    (failing that, on the most cells), as the width is the smallest that covers
    every held-out set. ``need``: the smallest weight each cell alone would take.
    """
    cells = list(held)
    ok = np.zeros((len(cells), len(ORDER_GRID)), dtype=bool)
    scored = []
    for cell in cells:
        d, prior = fits.domains[cell], held[cell]
        Z, z, _ = _logits(prior, fits.X(cell))
        steeper = Z[:, 1 + prior.features.index("in_rank")]
        scored.append((d, z, steeper, ndcg(d) - NDCG_SLACK))
    for j, w in enumerate(ORDER_GRID):
        ok[:, j] = [ndcg(d, z - w * up) >= floor for d, z, up, floor in scored]
        if ok[:, j].all():
            ok[:, j + 1 :] = True  # not computed: the first weight meeting all is it
            break
    met = ok.sum(axis=0)
    j = int(np.argmax(met))  # the first weight meeting the most cells
    need = {
        "/".join(c): float(ORDER_GRID[np.argmax(row)]) if row.any() else None
        for c, row in zip(cells, ok, strict=True)
    }
    return {"weight": float(ORDER_GRID[j]), "cells_met": int(met[j]), "need": need}


def pick(fits: Fits, held: Mapping[Cell, CrossDomainPrior]) -> dict[str, Any]:
    """The served level offset and width, from priors that did not see each cell.

    As :func:`calibration.prior.lodo_calibrate`: the offset minimising the mean, over
    cells, of the held-out Brier score over that of a constant at the cell's base
    rate (ties: nearest 0); the smallest width covering every cell at 80%.
    """
    cells = list(held)
    ratio = np.zeros((len(cells), len(OFFSET_GRID)))
    scored = []
    for i, cell in enumerate(cells):
        y = fits.domains[cell].y
        _, z, spread = _logits(held[cell], fits.X(cell))
        p = expit(z[:, None] + OFFSET_GRID[None, :])
        ratio[i] = np.mean(np.square(p - y[:, None]), axis=0) / (
            y.mean() * (1 - y.mean())
        )
        scored.append((y, z, spread))
    mean = ratio.mean(axis=0)
    best = np.flatnonzero(mean <= mean.min() + 1e-12)
    j = int(best[np.argmin(np.abs(OFFSET_GRID[best]))])
    offset = float(OFFSET_GRID[j])
    need: dict[str, float] = {}
    for cell, (y, z, spread) in zip(cells, scored, strict=True):
        half = spread[:, None] * WIDTH_GRID[None, :]
        covered = interval_coverages(
            y,
            expit(z + offset),
            expit(z[:, None] + offset - half),
            expit(z[:, None] + offset + half),
        )
        at = np.flatnonzero(covered >= 0.8)
        need["/".join(cell)] = float(WIDTH_GRID[at[0] if at.size else -1])
    return {
        "offset": offset,
        "width": max(need.values()),
        "ratio": {
            "/".join(c): float(r) for c, r in zip(cells, ratio[:, j], strict=True)
        },
        "need": need,
    }


def choose(fits: Fits, s: str, r: str) -> dict[str, Any]:
    """The order weight, offset and width for a prior fitted without ``s`` and ``r``.

    Chosen on the domains left in training only: the order weight with each of
    their *retrievers* held out in turn (the strength of a retriever is what it is
    about), the level and width with each of their *sets* held out in turn (the
    level is a collection's), as the search default's are.
    """
    sets, retrievers = frozenset({s}), frozenset({r})
    train = [(s2, r2) for (s2, r2) in fits.domains if s2 != s and r2 != r]
    order = order_weight(
        fits, {(s2, r2): fits.without(sets, retrievers | {r2}) for s2, r2 in train}
    )
    level = pick(
        fits,
        {
            (s2, r2): favour_input_order(
                fits.without(sets | {s2}, retrievers), order["weight"]
            )
            for s2, r2 in train
        },
    )
    return level | {"order_weight": order["weight"], "order": order}


def served_choice(fits: Fits) -> dict[str, Any]:
    """The shipped default's order weight, offset and width: every domain held out twice."""
    held = {
        (s, r): fits.without(frozenset({s}), frozenset({r})) for (s, r) in fits.domains
    }
    order = order_weight(fits, held)
    level = pick(
        fits, {c: favour_input_order(p, order["weight"]) for c, p in held.items()}
    )
    return level | {"order_weight": order["weight"], "order": order}


def held_out_twice(fits: Fits) -> dict[Cell, dict[str, Any]]:
    """Zero-label figures of every cell from a prior that saw neither its set nor its retriever."""
    out = {}
    sets = sorted({s for s, _ in fits.domains})
    for r in RETRIEVERS:
        for s in sets:
            if (s, r) not in fits.domains:
                continue
            chosen = choose(fits, s, r)
            fitted = fits.without(frozenset({s}), frozenset({r}))
            prior = dataclasses.replace(
                favour_input_order(fitted, chosen["order_weight"]),
                point_offset=chosen["offset"],
                width=chosen["width"],
            )
            d, X = fits.domains[(s, r)], fits.X((s, r))
            p = prior.predict_proba(X)
            lo, hi = prior.predict_interval(X)
            base = float(d.y.mean())
            n_in, n_out = ndcg(d), ndcg(d, p)
            out[(s, r)] = {
                "base_rate": base,
                "brier": brier_score(d.y, p),
                "brier_vs_constant": brier_score(d.y, p) / (base * (1 - base)),
                "nll": negative_log_likelihood(d.y, p),
                "auroc": auroc(d.y, p),
                "mean_p": float(p.mean()),
                "coverage": interval_coverage(d.y, p, lo, hi),
                "mean_width": float(np.mean(hi - lo)),
                "ndcg_input": n_in,
                "ndcg_returned": n_out,
                "ndcg_unweighted": ndcg(d, fitted.predict_proba(X)),
                "offset": chosen["offset"],
                "width": chosen["width"],
                "order_weight": chosen["order_weight"],
                "prior": prior,
            }
            print(
                f"{s}/{r}: coverage {out[(s, r)]['coverage']:.2f} brier/const "
                f"{out[(s, r)]['brier_vs_constant']:.2f} ndcg {n_in:.3f} -> {n_out:.3f}"
                f" (order weight {chosen['order_weight']:.2f}; without it "
                f"{out[(s, r)]['ndcg_unweighted']:.3f})",
                file=sys.stderr,
                flush=True,
            )
    return out


# -- the ladder ----------------------------------------------------------------------
def query_codes(domains: Mapping[Cell, Domain]) -> NDArray[np.int64]:
    """Each row's query, one code per (set, query) whatever the retriever.

    A query's lists under the six retrievers share the query (and most documents):
    one unit of the paired comparison, not six.
    """
    keys = np.concatenate(
        [np.array([f"{s}\t{q}" for q in d.queries]) for (s, _), d in domains.items()]
    )
    _, codes = np.unique(keys, return_inverse=True)
    return codes.astype(np.int64)


def lodo_predictions(fits: Fits) -> FloatArray:
    """Held-out probabilities of every domain from a prior fitted without its set."""
    return np.concatenate(
        [
            fits.without(frozenset({s}), frozenset()).predict_proba(fits.X((s, r)))
            for (s, r) in fits.domains
        ]
    )


def ladder(domains: Mapping[Cell, Domain]) -> dict[str, Any]:
    """Evidence groups added in turn, each kept by the one-SE rule (LODO by set)."""
    y = np.concatenate([d.y for d in domains.values()])
    codes = query_codes(domains)
    kept = BASE
    p_kept = lodo_predictions(Fits(domains, kept))
    steps = []
    for label, group in LADDER:
        trial = (*kept, *group)
        p_trial = lodo_predictions(Fits(domains, trial))
        gain, se = paired_nll_gain(p_trial, p_kept, y, codes)
        step: dict[str, Any] = {
            "group": label,
            "features": list(group),
            "nll_gain": gain,
            "se": se,
            "kept": bool(gain > se),
        }
        if group == LEXICAL:
            p_bg = lodo_predictions(Fits(domains, trial, bg=True))
            bg_gain, bg_se = paired_nll_gain(p_bg, p_kept, y, codes)
            vs, vs_se = paired_nll_gain(p_trial, p_bg, y, codes)
            step["background"] = {"nll_gain": bg_gain, "se": bg_se}
            step["in_list_vs_background"] = {"nll_gain": vs, "se": vs_se}
        steps.append(step)
        print(f"ladder {label}: {gain:+.5f} ± {se:.5f}", file=sys.stderr, flush=True)
        if step["kept"]:
            kept, p_kept = trial, p_trial
    return {"steps": steps, "features": list(kept)}


# -- few labels ----------------------------------------------------------------------
def few_labels(
    fits: Fits, held: Mapping[Cell, dict[str, Any]], draws: int, seed: int
) -> dict[Cell, dict[str, Any]]:
    """The held-out prior refitted on n judged lists vs Platt on the input scores."""
    rng = np.random.default_rng(seed)
    out: dict[Cell, dict[str, Any]] = {}
    for cell, d in fits.domains.items():
        X = fits.X(cell)
        prior: CrossDomainPrior = held[cell]["prior"]
        n_q = len(d.offsets) - 1
        has_pos = np.array(
            [d.y[d.offsets[q] : d.offsets[q + 1]].max() for q in range(n_q)]
        )
        out[cell] = {}
        for n in SIZES:
            if n_q - n < MIN_TEST:
                continue
            rows: dict[str, list[float]] = {"prior": [], "platt": []}
            for _ in range(draws):
                train = _draw(rng, n_q, n, has_pos)
                if train is None:
                    continue
                test = np.setdiff1d(np.arange(n_q), train)
                tr, te = _rows(d, train), _rows(d, test)
                est = PriorCalibrator(prior=prior.to_dict()).fit(
                    X[tr], d.y[tr], d.groups[tr]
                )
                rows["prior"].append(brier_score(d.y[te], est.predict_proba(X[te])))
                Xs = np.zeros((len(d.raw), len(FEATURES)))
                Xs[:, 0] = d.raw  # Platt on the retriever's own scores
                try:
                    platt = PlattCalibrator().fit(Xs[tr], d.y[tr], d.groups[tr])
                    p_platt = platt.predict_proba(Xs[te])
                except SingleClassError:
                    p_platt = np.full(len(te), np.clip(d.y[tr].mean(), 1e-4, 1 - 1e-4))
                rows["platt"].append(brier_score(d.y[te], p_platt))
            if rows["prior"]:
                out[cell][str(n)] = {k: float(np.mean(v)) for k, v in rows.items()} | {
                    "draws": len(rows["prior"])
                }
    return out


def _draw(
    rng: np.random.Generator, n_q: int, n: int, has_pos: FloatArray
) -> NDArray[np.int64] | None:
    for _ in range(50):
        pick = np.sort(rng.choice(n_q, size=n, replace=False))
        if has_pos[pick].sum() > 0:
            return pick.astype(np.int64)
    return None


def _rows(d: Domain, queries: NDArray[np.int64]) -> NDArray[np.int64]:
    return np.concatenate(
        [np.arange(d.offsets[q], d.offsets[q + 1]) for q in queries]
    ).astype(np.int64)


# -- tables --------------------------------------------------------------------------
def _f(x: float, d: int = 3) -> str:
    return "-" if x is None or not np.isfinite(x) else f"{x:.{d}f}"


def held_table(held: Mapping[Cell, dict[str, Any]]) -> str:
    lines = [
        "| set | retriever | base rate | coverage | Brier ÷ constant | AUROC | mean p "
        "| nDCG@10 input | returned | Δ |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (s, r), h in sorted(
        held.items(), key=lambda kv: (RETRIEVERS.index(kv[0][1]), kv[0][0])
    ):
        delta = h["ndcg_returned"] - h["ndcg_input"]
        flags = []
        if h["coverage"] < 0.8:
            flags.append("coverage")
        if h["brier_vs_constant"] > 1.25:
            flags.append("Brier")
        if delta < -0.01:
            flags.append("nDCG")
        lines.append(
            f"| {s} | {r} | {_f(h['base_rate'])} | {_f(h['coverage'], 2)} "
            f"| {_f(h['brier_vs_constant'], 2)} | {_f(h['auroc'])} | {_f(h['mean_p'])} "
            f"| {_f(h['ndcg_input'])} | {_f(h['ndcg_returned'])} | {delta:+.3f}"
            f"{' **' + ', '.join(flags) + '**' if flags else ''} |"
        )
    cells = list(held.values())
    lines += [
        "",
        f"{len(cells)} held-out cells: coverage ≥ 0.8 on "
        f"{sum(h['coverage'] >= 0.8 for h in cells)}, Brier ÷ constant ≤ 1.25 on "
        f"{sum(h['brier_vs_constant'] <= 1.25 for h in cells)}, returned nDCG@10 ≥ "
        f"input - 0.01 on "
        f"{sum(h['ndcg_returned'] >= h['ndcg_input'] - 0.01 for h in cells)}.",
    ]
    return "\n".join(lines)


def few_table(few: Mapping[Cell, dict[str, Any]]) -> str:
    lines = [
        "| retriever | n | cells | prior Brier (mean) | Platt on input scores | prior ≤ Platt |",
        "|---|---|---|---|---|---|",
    ]
    for r in RETRIEVERS:
        for n in SIZES:
            rows = [v[str(n)] for (s, rr), v in few.items() if rr == r and str(n) in v]
            if not rows:
                continue
            wins = sum(x["prior"] <= x["platt"] for x in rows)
            lines.append(
                f"| {r} | {n} | {len(rows)} | {np.mean([x['prior'] for x in rows]):.4f} "
                f"| {np.mean([x['platt'] for x in rows]):.4f} | {wins} of {len(rows)} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--cache", type=Path, default=CACHE)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--sets", nargs="+", default=list(SETS))
    parser.add_argument("--draws", type=int, default=10)
    parser.add_argument("--features", nargs="+", help="skip the ladder: use these")
    parser.add_argument(
        "--mpnet",
        choices=("embed", "cached"),
        default="embed",
        help="cached: the mpnet and RRF lists of the sets already embedded only",
    )
    args = parser.parse_args(argv)
    lists = load_all(args.sets, args.data, args.cache, mpnet=args.mpnet)
    query_ref, doc_ref = references(lists)
    domains = {cell: as_domain(d, query_ref, doc_ref) for cell, d in lists.items()}
    payload: dict[str, Any] = {"sets": args.sets, "retrievers": list(RETRIEVERS)}
    with single_threaded_blas():
        if args.features:
            features = tuple(args.features)
        else:
            payload["ladder"] = ladder(domains)
            features = tuple(payload["ladder"]["features"])
        payload["features"] = list(features)
        fits = Fits(domains, features)
        held = held_out_twice(fits)
        print(held_table(held))
        few = few_labels(fits, held, args.draws, seed=0)
        print("\n" + few_table(few))
    payload["held_out"] = {
        f"{s}/{r}": {k: v for k, v in h.items() if k != "prior"}
        for (s, r), h in held.items()
    }
    payload["few_label"] = {f"{s}/{r}": v for (s, r), v in few.items()}
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(to_jsonable(payload), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
