"""Honest evaluation of the whole fitting procedure (the maths of ``normcal eval``).

Pure functions of labelled :class:`~calibration.profile.QueryEvidence`; reading a
dataset, embedding and printing tables is ``app.cli.evaluation``. Evaluates:

* **Retrieval**: nDCG@10 (graded gains, trec_eval's linear gain and log2 discount) and
  Recall@100 over the judged queries with at least one relevant document, per mode
  (:func:`mode_rankings`): ``dense`` (cosine), ``lexical`` (BM25), ``rrf`` (reciprocal
  rank fusion, k = 60), ``blend`` (convex blend of per-query min-max-normalised cosine
  and BM25, the weight chosen on the training queries of the same outer folds) and
  ``calibrated`` (``auto``'s held-out probability from the same nested CV). Every mode
  ranks the *same* candidate pool per query (:class:`RankingPool`: the dense top-N
  and the BM25 top-N, N = ``depth``), so dense and lexical keep their exact top-N.
  The calibrated ranking's paired per-query gain over dense, RRF and the blend comes
  with its standard error (:func:`paired_gain`).
* **Calibration** of the top-``k`` pairs of every judged query, either under an outer
  ``n_splits``-fold split *by query* (nested: inside each training fold the query
  :class:`~calibration.NormReference` is refitted on the training queries and
  ``select_calibrator(method="auto")`` runs on the training fold only; the document
  reference is label-free, so it is fitted once on the whole corpus), or by fitting
  on one split and evaluating on another (``fit_evidence``). Fixed methods are the
  method's default template fitted on the same training data. Metrics (ECE with
  ``BINNING``, Brier, NLL, AUROC) are computed on the pooled held-out pairs.
* The **norm lift** (gamma +- sd) from ``select_calibrator`` on all fitting data,
  **reliability by query-ell tercile** (Platt vs auto), a **few-label curve** and the
  **query-level confidence AUROC** (cross-fitted).

The main mode is the service's default (``allow_reorder: true``): document-side
evidence (BM25, document norm and length) may be used, so probabilities may order a
query's hits differently from cosine; ``auto/query-side`` additionally evaluates the
``allow_reorder: false`` fit (query-side terms only).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from calibration.exceptions import SingleClassError
from calibration.features import ELL_Q, NormReference
from calibration.fusion import SearchMode, order_by_mode
from calibration.metrics import (
    BINNING,
    auroc,
    brier_score,
    negative_log_likelihood,
    reliability_by_tercile,
)
from calibration.prior import CrossDomainPrior, interval_coverage
from calibration.profile import (
    Profile,
    QueryEvidence,
    build_features,
    labels_of,
    query_model_is_supported,
    query_reference,
    single_threaded_blas,
)
from calibration.query import (
    QueryConfidenceModel,
    cross_fit_query_confidence,
    noisy_or_by_query,
    query_table,
)
from calibration.report import to_jsonable
from calibration.selection import (
    METHODS,
    SelectionResult,
    make_calibrator,
    select_calibrator,
)

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
Progress = Callable[[str], None]

AUTO = "auto"
AUTO_QUERY_SIDE = "auto/query-side"
MIN_HELD_OUT_QUERIES = 10
BLEND_GRID = np.linspace(0.0, 1.0, 21)
"""Weights of the cosine in the convex blend tried on the training queries."""


@dataclass(frozen=True)
class EvalOptions:
    """Knobs of an evaluation run.

    Attributes
    ----------
    k : int
        Top-k hits per query that form the calibration pairs.
    depth : int
        Retrieval depth for Recall (at least ``k``).
    n_splits : int
        Outer folds (and inner folds of ``select_calibrator``).
    few_label_sizes : tuple of int
        Numbers of labelled queries of the few-label curve.
    few_label_draws : int
        Random draws per size.
    query_side : bool
        Also evaluate ``auto`` restricted to query-side terms, whose probabilities
        never order a query's hits differently from cosine (``auto/query-side``).
    seed : int
        Seed of the fold assignment and the few-label draws.
    prior : CrossDomainPrior or None
        The shipped cross-domain prior; ``auto`` then includes the ``prior`` family,
        as in a collection's fit.
    """

    k: int = 20
    depth: int = 100
    n_splits: int = 5
    few_label_sizes: tuple[int, ...] = (5, 10, 30, 100)
    few_label_draws: int = 5
    query_side: bool = True
    seed: int = 0
    prior: CrossDomainPrior | None = None


# -- retrieval metrics ------------------------------------------------------------------
def ndcg_at_k(ranked: Sequence[str], judged: Mapping[str, int], k: int = 10) -> float:
    """nDCG@k with graded gains (``rel``) and ``1/log2(rank + 1)`` discount.

    The ideal ranking uses every judged document with relevance > 0, retrieved or not.
    Returns ``nan`` when the query has no relevant document.
    """
    ideal = sorted((g for g in judged.values() if g > 0), reverse=True)[:k]
    if not ideal:
        return float("nan")
    dcg = sum(
        max(judged.get(d, 0), 0) / math.log2(i + 2) for i, d in enumerate(ranked[:k])
    )
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg


def recall_at_k(
    ranked: Sequence[str], judged: Mapping[str, int], k: int = 100
) -> float:
    """Fraction of relevant (> 0) documents in the top ``k``; ``nan`` if none exist."""
    relevant = {d for d, g in judged.items() if g > 0}
    if not relevant:
        return float("nan")
    return len(relevant.intersection(ranked[:k])) / len(relevant)


def retrieval_metrics(
    ranked: Mapping[str, Sequence[str]],
    qrels: Mapping[str, Mapping[str, int]],
    *,
    ndcg_k: int = 10,
    recall_k: int = 100,
) -> dict[str, Any]:
    """Mean nDCG@10 and Recall@100 over queries with at least one relevant document."""
    ndcg = [ndcg_at_k(ranked[q], qrels.get(q, {}), ndcg_k) for q in ranked]
    recall = [recall_at_k(ranked[q], qrels.get(q, {}), recall_k) for q in ranked]
    scored = [v for v in ndcg if not math.isnan(v)]
    return {
        f"ndcg@{ndcg_k}": float(np.mean(scored)) if scored else None,
        f"recall@{recall_k}": (
            float(np.nanmean(recall)) if scored else None  # same queries as nDCG
        ),
        "n_queries": len(ranked),
        "n_queries_with_relevant": len(scored),
    }


def paired_gain(
    ranked: Mapping[str, Sequence[str]],
    base: Mapping[str, Sequence[str]],
    qrels: Mapping[str, Mapping[str, int]],
    k: int = 10,
) -> dict[str, float | int | None]:
    """Mean per-query nDCG@k gain of ``ranked`` over ``base`` and its standard error.

    Over the queries with a relevant document, the independent units; a gap within
    one standard error cannot be told from the queries' spread. SE is ``None``
    (no spread to measure) with fewer than two queries.
    """
    diff = np.array(
        [
            ndcg_at_k(ranked[q], qrels.get(q, {}), k)
            - ndcg_at_k(base[q], qrels.get(q, {}), k)
            for q in ranked
        ]
    )
    diff = diff[~np.isnan(diff)]
    se = float(diff.std(ddof=1) / np.sqrt(diff.size)) if diff.size > 1 else None
    return {
        "gain": float(diff.mean()) if diff.size else 0.0,
        "se": se,
        "n_queries": int(diff.size),
    }


# -- retrieval modes over one shared candidate pool ---------------------------------------
@dataclass(frozen=True)
class RankingPool:
    """One judged query's candidate pool, which every retrieval mode reorders.

    ``evidence`` is the pool as calibration evidence (cosines in ``scores``, BM25 and
    BM25-list ranks in ``lexical``); its first ``n_dense`` members are the dense list
    in order, the rest are BM25-list members the dense list lacks. ``depth`` is the N
    of both lists; ``judged`` the query's graded judgments.
    """

    query_id: str
    docs: list[str]
    evidence: QueryEvidence
    n_dense: int
    depth: int
    judged: Mapping[str, int]


def mode_order(
    pool: RankingPool,
    mode: SearchMode,
    *,
    weight: float = 0.5,
    proba: FloatArray | None = None,
) -> list[str]:
    """The pool's documents ordered by ``mode`` (``calibration.fusion.order_by_mode``).

    The BM25-list position is the rank within the lists' depth (``inf`` beyond);
    ``hybrid`` orders by ``proba``, the calibrated probabilities.
    """
    e = pool.evidence
    n = len(e.scores)
    bm25 = np.zeros(n) if e.lexical is None else np.asarray(e.lexical.bm25, float)
    lex_rank = (
        np.full(n, np.inf)
        if e.lexical is None
        else np.where(e.lexical.rank <= pool.depth, e.lexical.rank, np.inf)
    )
    order = order_by_mode(
        mode,
        np.asarray(e.scores),
        pool.n_dense,
        lex_rank,
        bm25,
        probability=proba,
        weight=weight,
    )
    return [pool.docs[i] for i in order]


def _mean_ndcg(pools: Sequence[RankingPool], orders: Sequence[list[str]]) -> float:
    values = [ndcg_at_k(o, p.judged) for p, o in zip(pools, orders, strict=True)]
    scored = [v for v in values if not math.isnan(v)]
    return float(np.mean(scored)) if scored else 0.0


def tune_blend(pools: Sequence[RankingPool]) -> float:
    """The cosine weight with the best mean nDCG@10 on ``pools``.

    Tried over :data:`BLEND_GRID`; the smallest such weight wins ties.
    """
    scores = [
        _mean_ndcg(pools, [mode_order(p, "blend", weight=float(w)) for p in pools])
        for w in BLEND_GRID
    ]
    return float(BLEND_GRID[int(np.argmax(scores))])


def mode_rankings(
    pools: Sequence[RankingPool],
    folds: Sequence[IntArray],
    calibrated: Mapping[str, Sequence[FloatArray]],
) -> dict[str, Any]:
    """nDCG@10 and Recall@100 of every retrieval mode on the same pools.

    ``folds`` (query indices) are the outer folds: the blend weight of a fold's
    queries is tuned on the other folds' queries only. ``calibrated`` maps ``auto``
    (and ``auto/query-side``) to held-out probabilities per pool member; each
    calibrated ranking also carries its paired gain over dense, RRF and the blend
    (``gain_over``, :func:`paired_gain`).
    """
    qrels = {p.query_id: p.judged for p in pools}
    ranked: dict[str, dict[str, list[str]]] = {
        mode: {p.query_id: mode_order(p, mode) for p in pools}
        for mode in ("dense", "lexical", "rrf")
    }
    out: dict[str, Any] = {
        mode: retrieval_metrics(ranked[mode], qrels) for mode in ranked
    }
    ranked["blend"] = {}
    weights = []
    for test_q in folds:
        train_q = np.setdiff1d(np.arange(len(pools)), test_q)
        w = tune_blend([pools[q] for q in train_q])
        weights.append(w)
        for q in test_q:
            ranked["blend"][pools[q].query_id] = mode_order(pools[q], "blend", weight=w)
    out["blend"] = {
        **retrieval_metrics(ranked["blend"], qrels),
        "cosine_weight_per_fold": weights,
        "tuned": "max mean nDCG@10 over the other outer folds' queries (grouped CV)",
    }
    for method, name in (
        (AUTO, "calibrated"),
        (AUTO_QUERY_SIDE, "calibrated/query-side"),
    ):
        if method in calibrated:
            mine = {
                p.query_id: mode_order(p, "hybrid", proba=calibrated[method][i])
                for i, p in enumerate(pools)
            }
            out[name] = {
                **retrieval_metrics(mine, qrels),
                "gain_over": {
                    mode: paired_gain(mine, ranked[mode], qrels)
                    for mode in ("dense", "rrf", "blend")
                },
            }
    depth = max((p.depth for p in pools), default=0)
    out["pool"] = (
        f"per query the dense top-{depth} and the BM25 top-{depth} "
        f"(calibration.fusion.candidate_pool); every mode reorders the same pool"
    )
    return out


# -- calibration ------------------------------------------------------------------------
def _metrics(y: FloatArray, p: FloatArray) -> dict[str, float]:
    return {
        "ece": BINNING.ece(y, p),
        "brier": brier_score(y, p),
        "nll": negative_log_likelihood(y, p),
        "auroc": auroc(y, p),
    }


def ece_noise_floor(p: FloatArray, n_sims: int = 100, seed: int = 0) -> float:
    """Mean ECE of a *perfectly calibrated* predictor with these probabilities.

    Labels are drawn from ``p`` itself, so any ECE above zero is sampling noise of
    the ``BINNING`` estimate at this number of pairs: a measured ECE near this floor
    is as good as the data can show.
    """
    rng = np.random.default_rng(seed)
    return float(
        np.mean(
            [
                BINNING.ece((rng.uniform(size=p.shape) < p).astype(float), p)
                for _ in range(n_sims)
            ]
        )
    )


def _pairs(
    evidence: Sequence[QueryEvidence], query_ref: NormReference, doc_ref: NormReference
) -> tuple[FloatArray, FloatArray, IntArray]:
    X, groups = build_features(evidence, query_ref, doc_ref)
    return X, labels_of(evidence), groups


@dataclass
class _Fitted:
    """Predictions of every method on held-out pairs, from one training set."""

    proba: dict[str, FloatArray]
    chosen: str
    chosen_query_side: str | None
    confidence: FloatArray | None  # auto's query confidence per held-out query
    rank_proba: dict[str, FloatArray]  # auto (and auto/query-side) on the ranking pools


def _fit_predict(
    train: Sequence[QueryEvidence],
    test: Sequence[QueryEvidence],
    doc_ref: NormReference,
    options: EvalOptions,
    *,
    with_confidence: bool = False,
    rank_test: Sequence[QueryEvidence] = (),
) -> _Fitted:
    """Fit every method on ``train`` (query ref included) and predict ``test``.

    ``rank_test`` (the ranking pools of the same held-out queries) gets ``auto``'s
    probabilities from the same fitted models.
    """
    query_ref = query_reference(train)
    X_tr, y_tr, g_tr = _pairs(train, query_ref, doc_ref)
    X_te, _, g_te = _pairs(test, query_ref, doc_ref)
    X_rank = build_features(rank_test, query_ref, doc_ref)[0] if rank_test else None
    proba: dict[str, FloatArray] = {}
    for method in METHODS:
        try:
            est = make_calibrator(method, query_side_only=False).fit(X_tr, y_tr, g_tr)
            proba[method] = est.predict_proba(X_te)
        except SingleClassError:
            proba[method] = np.full(len(X_te), np.clip(y_tr.mean(), 1e-4, 1 - 1e-4))
    select = functools.partial(
        select_calibrator,
        X_tr,
        y_tr,
        g_tr,
        method=AUTO,
        n_splits=min(options.n_splits, len(train)),
        prior=options.prior,
    )
    sel = select(query_side_only=False)
    proba[AUTO] = sel.estimator.predict_proba(X_te)
    rank_proba = {} if X_rank is None else {AUTO: sel.estimator.predict_proba(X_rank)}
    chosen_query_side = None
    if options.query_side:
        sel_r = select(query_side_only=True)
        proba[AUTO_QUERY_SIDE] = sel_r.estimator.predict_proba(X_te)
        if X_rank is not None:
            rank_proba[AUTO_QUERY_SIDE] = sel_r.estimator.predict_proba(X_rank)
        chosen_query_side = _served(sel_r)
    confidence = None
    if with_confidence:
        Q_tr, hit, _ = query_table(sel.oof_proba, g_tr, X_tr[:, ELL_Q], y_tr)
        assert hit is not None
        if 0 < hit.sum() < len(hit):
            model = QueryConfidenceModel().fit(Q_tr, hit)
            Q_te, _, _ = query_table(proba[AUTO], g_te, X_te[:, ELL_Q])
            confidence = model.predict_proba(Q_te)
    return _Fitted(proba, _served(sel), chosen_query_side, confidence, rank_proba)


def _served(sel: SelectionResult) -> str:
    """The served map's name: the wire method, ``+recal`` with the recalibration stage."""
    return sel.method + (
        "+recal" if sel.why is not None and sel.why.recalibrated else ""
    )


def _offsets(evidence: Sequence[QueryEvidence]) -> IntArray:
    return np.concatenate([[0], np.cumsum([len(e.scores) for e in evidence])]).astype(
        np.int64
    )


def _rows(offsets: IntArray, queries: Sequence[int] | IntArray) -> IntArray:
    return np.concatenate(
        [np.arange(offsets[q], offsets[q + 1]) for q in queries]
    ).astype(np.int64)


def _query_folds(n_queries: int, n_splits: int, seed: int) -> list[IntArray]:
    """Shuffled, near-equal folds of query indices (grouped by construction)."""
    order = np.random.default_rng(seed).permutation(n_queries)
    return [np.sort(f).astype(np.int64) for f in np.array_split(order, n_splits)]


def nested_cv(
    evidence: Sequence[QueryEvidence],
    doc_ref: NormReference,
    options: EvalOptions,
    progress: Progress | None = None,
) -> tuple[dict[str, FloatArray], list[str], list[str]]:
    """Held-out probabilities of every method for every pair, by outer folds of queries.

    Returns
    -------
    proba : dict
        ``{method: ndarray of shape (n_pairs,)}`` in evidence order.
    chosen, chosen_query_side : list of str
        ``auto``'s choice per outer fold (and restricted to query-side terms);
        ``+recal`` marks the recalibration stage.
    """
    out = _nested_cv(evidence, doc_ref, options, progress)
    return out.proba, out.chosen, out.chosen_query_side


@dataclass
class _NestedCV:
    proba: dict[str, FloatArray]
    chosen: list[str]
    chosen_query_side: list[str]
    rank_proba: dict[str, list[FloatArray]]  # per query, in evidence order


def _nested_cv(
    evidence: Sequence[QueryEvidence],
    doc_ref: NormReference,
    options: EvalOptions,
    progress: Progress | None = None,
    rank_evidence: Sequence[QueryEvidence] = (),
) -> _NestedCV:
    """:func:`nested_cv`, plus ``auto``'s out-of-fold probabilities on the pools.

    ``rank_evidence`` holds one ranking pool per query of ``evidence``; each is
    predicted by the models of the fold that held its query out.
    """
    offsets = _offsets(evidence)
    n_pairs = int(offsets[-1])
    rank_offsets = _offsets(rank_evidence) if rank_evidence else None
    out = _NestedCV({}, [], [], {})
    folds = _query_folds(len(evidence), options.n_splits, options.seed)
    with single_threaded_blas():
        for i, test_q in enumerate(folds):
            if progress is not None:
                progress(f"outer fold {i + 1}/{len(folds)}")
            train_q = np.setdiff1d(np.arange(len(evidence)), test_q)
            fitted = _fit_predict(
                [evidence[q] for q in train_q],
                [evidence[q] for q in test_q],
                doc_ref,
                options,
                rank_test=[rank_evidence[q] for q in test_q] if rank_evidence else (),
            )
            rows = _rows(offsets, test_q)
            for method, p in fitted.proba.items():
                out.proba.setdefault(method, np.full(n_pairs, np.nan))[rows] = p
            for method, p in fitted.rank_proba.items():
                assert rank_offsets is not None
                per_query = out.rank_proba.setdefault(
                    method, [np.zeros(0)] * len(evidence)
                )
                start = 0
                for q in test_q:
                    size = int(rank_offsets[q + 1] - rank_offsets[q])
                    per_query[q] = p[start : start + size]
                    start += size
            out.chosen.append(fitted.chosen)
            if fitted.chosen_query_side is not None:
                out.chosen_query_side.append(fitted.chosen_query_side)
    return out


def _draw_train(
    rng: np.random.Generator,
    candidates: IntArray,
    n: int,
    has_positive: FloatArray,
) -> IntArray | None:
    """``n`` random queries with at least one relevant pair (both classes present)."""
    for _ in range(50):
        pick = np.sort(rng.choice(candidates, size=n, replace=False))
        if 0 < has_positive[pick].sum():
            return pick.astype(np.int64)
    return None


def few_label_curve(
    pool: Sequence[QueryEvidence],
    doc_ref: NormReference,
    options: EvalOptions,
    *,
    test: Sequence[QueryEvidence] | None = None,
    full_auto_proba: FloatArray | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Fit auto and Platt on ``n`` labelled queries; evaluate on held-out queries.

    With ``test`` (fit-split mode) every draw is evaluated on ``test`` and the
    full-data reference is auto fitted on the whole ``pool``. Otherwise the held-out
    queries are the rest of ``pool`` and the reference is ``full_auto_proba`` (the
    nested-CV predictions of auto) on the same held-out pairs.
    """
    with single_threaded_blas():
        return _few_label_curve(
            pool,
            doc_ref,
            options,
            test=test,
            full_auto_proba=full_auto_proba,
            progress=progress,
        )


def _few_label_curve(
    pool: Sequence[QueryEvidence],
    doc_ref: NormReference,
    options: EvalOptions,
    *,
    test: Sequence[QueryEvidence] | None,
    full_auto_proba: FloatArray | None,
    progress: Progress | None,
) -> dict[str, Any]:
    rng = np.random.default_rng(options.seed + 1)
    has_pos = np.array([float(labels_of([e]).max()) for e in pool])
    offsets = _offsets(pool)
    full_test_brier = full_test_nll = None
    options_main_only = EvalOptions(
        k=options.k,
        n_splits=options.n_splits,
        query_side=False,
        seed=options.seed,
        prior=options.prior,
    )
    if test is not None:
        y_test = labels_of(test)
        full = _fit_predict(pool, test, doc_ref, options_main_only)
        full_test_brier = brier_score(y_test, full.proba[AUTO])
        full_test_nll = negative_log_likelihood(y_test, full.proba[AUTO])
    out: dict[str, Any] = {
        "held_out": "test split" if test is not None else "the other queries",
        "draws": options.few_label_draws,
        "full_data": None
        if test is None
        else {"auto": {"brier": full_test_brier, "nll": full_test_nll}},
        "sizes": {},
    }
    for n in options.few_label_sizes:
        if test is None and len(pool) - n < MIN_HELD_OUT_QUERIES:
            out["sizes"][str(n)] = {"skipped": f"only {len(pool)} judged queries"}
            continue
        if test is not None and n > len(pool):
            out["sizes"][str(n)] = {"skipped": f"only {len(pool)} fitting queries"}
            continue
        if progress is not None:
            progress(f"few-label n={n}")
        rows: dict[str, list[float]] = {
            k: []
            for k in ("auto_brier", "auto_nll", "platt_brier", "platt_nll", "ratio")
        }
        for _ in range(options.few_label_draws):
            train_q = _draw_train(rng, np.arange(len(pool)), n, has_pos)
            if train_q is None:
                continue
            if test is None:
                test_q = np.setdiff1d(np.arange(len(pool)), train_q)
                held = [pool[q] for q in test_q]
                assert full_auto_proba is not None
                ref = full_auto_proba[_rows(offsets, test_q)]
            else:
                held = list(test)
            fitted = _fit_predict(
                [pool[q] for q in train_q], held, doc_ref, options_main_only
            )
            y = labels_of(held)
            b_auto = brier_score(y, fitted.proba[AUTO])
            rows["auto_brier"].append(b_auto)
            rows["auto_nll"].append(negative_log_likelihood(y, fitted.proba[AUTO]))
            rows["platt_brier"].append(brier_score(y, fitted.proba["platt"]))
            rows["platt_nll"].append(negative_log_likelihood(y, fitted.proba["platt"]))
            full_b = full_test_brier if test is not None else brier_score(y, ref)
            assert full_b is not None
            rows["ratio"].append(b_auto / full_b)
        out["sizes"][str(n)] = {
            "n_draws": len(rows["ratio"]),
            "auto": {
                "brier": _mean(rows["auto_brier"]),
                "brier_sd": _sd(rows["auto_brier"]),
                "nll": _mean(rows["auto_nll"]),
            },
            "platt": {
                "brier": _mean(rows["platt_brier"]),
                "brier_sd": _sd(rows["platt_brier"]),
                "nll": _mean(rows["platt_nll"]),
            },
            # auto's Brier with n labels / auto's Brier with all labels, same pairs
            "auto_brier_vs_full": _mean(rows["ratio"]),
            "auto_brier_vs_full_max": max(rows["ratio"]) if rows["ratio"] else None,
        }
    return out


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def _sd(values: list[float]) -> float | None:
    return float(np.std(values, ddof=1)) if len(values) > 1 else None


def _query_level(
    p: FloatArray,
    groups: IntArray,
    ell_q: FloatArray,
    y: FloatArray,
    options: EvalOptions,
    confidence: FloatArray | None = None,
) -> dict[str, Any]:
    """AUROC of query confidence for "any relevant hit in the top k"."""
    Q, hit, _ = query_table(p, groups, ell_q, y)
    assert hit is not None
    max_p = np.array([p[groups == q].max() for q in range(len(hit))])
    out: dict[str, Any] = {
        "n_queries": len(hit),
        "with_relevant_in_top_k": int(hit.sum()),
        "auroc": None,
        "auroc_max_probability": None,
    }
    n_min = int(min(hit.sum(), len(hit) - hit.sum()))
    if n_min == 0:
        out["note"] = "every query has the same outcome: AUROC undefined"
        return out
    out["auroc_max_probability"] = auroc(hit, max_p)
    if confidence is not None:  # fitted on the fitting split, applied to the test
        out["auroc"] = auroc(hit, confidence)
        out["how"] = "query model fitted on the fitting split"
    elif query_model_is_supported(hit, options.n_splits):
        held = cross_fit_query_confidence(
            Q, hit, n_splits=options.n_splits, random_state=options.seed
        )
        out["auroc"] = auroc(hit, held)
        out["how"] = (
            f"{options.n_splits}-fold cross-fitted on held-out pair probabilities"
        )
    else:  # what the service serves then (calibration.profile._fit_query_level)
        out["auroc"] = auroc(hit, noisy_or_by_query(p, groups))
        out["how"] = (
            "noisy-OR of held-out hit probabilities (too few queries of one outcome)"
        )
    return out


def evaluate_calibration(
    evidence: Sequence[QueryEvidence],
    doc_norms: FloatArray,
    doc_tokens: IntArray,
    options: EvalOptions | None = None,
    *,
    fit_evidence: Sequence[QueryEvidence] | None = None,
    progress: Progress | None = None,
    default_profile: Profile | None = None,
    ranking: Sequence[RankingPool] | None = None,
    dense_evidence: Sequence[QueryEvidence] | None = None,
    fit_dense_evidence: Sequence[QueryEvidence] | None = None,
) -> dict[str, Any]:
    """Calibration part of ``normcal eval`` (module docstring), JSON-able.

    Parameters
    ----------
    evidence : sequence of QueryEvidence
        Labelled top-k evidence of the evaluated queries.
    doc_norms, doc_tokens : ndarray
        Unlabelled corpus sample for the document-side NormReference.
    options : EvalOptions or None
        Defaults if None.
    fit_evidence : sequence of QueryEvidence or None
        Fit on these queries and evaluate on ``evidence`` instead of nested CV.
    progress : callable or None
        Receives short progress messages.
    default_profile : Profile or None
        The shipped default: scored on ``evidence`` with no judgments from it
        (``zero_label``); its prior joins ``auto`` unless ``options`` names one.
    ranking : sequence of RankingPool or None
        One pool per query of ``evidence``: adds ``retrieval`` per mode
        (:func:`mode_rankings`), ``calibrated`` ranked by the same held-out models.
    dense_evidence, fit_dense_evidence : sequence of QueryEvidence or None
        The dense-only pools of the same queries: adds ``calibration_by_pool``
        (Platt vs ``auto`` on the dense pool beside the main, ``evidence``, pool).
    """
    opts = options or EvalOptions()
    if default_profile is not None and opts.prior is None:
        opts = dataclasses.replace(opts, prior=default_profile.prior)
    with single_threaded_blas():
        out = _evaluate_calibration(
            evidence, doc_norms, doc_tokens, opts, fit_evidence, progress, ranking
        )
        if dense_evidence is not None:
            out["calibration_by_pool"] = {
                "hybrid": _platt_vs_auto(out["methods"]),
                "dense": _platt_vs_auto(
                    _pool_methods(
                        dense_evidence, doc_norms, doc_tokens, opts, fit_dense_evidence
                    )
                ),
            }
        if default_profile is not None:
            out["zero_label"] = zero_label(evidence, default_profile)
        return out


def _pool_methods(
    evidence: Sequence[QueryEvidence],
    doc_norms: FloatArray,
    doc_tokens: IntArray,
    options: EvalOptions,
    fit_evidence: Sequence[QueryEvidence] | None,
) -> dict[str, dict[str, float]]:
    """Held-out metrics of every method on another pool of the same queries.

    Same protocol as the main evaluation, without the auto/query-side row.
    """
    opts = dataclasses.replace(options, query_side=False)
    evidence = [e for e in evidence if len(e.scores)]
    doc_ref = NormReference().fit(doc_norms, doc_tokens)
    if fit_evidence is None:
        proba = _nested_cv(evidence, doc_ref, opts).proba
    else:
        fit = [e for e in fit_evidence if len(e.scores)]
        proba = _fit_predict(fit, evidence, doc_ref, opts).proba
    y = labels_of(evidence)
    return {m: _metrics(y, p) for m, p in proba.items()}


def _platt_vs_auto(methods: Mapping[str, Mapping[str, float]]) -> dict[str, Any]:
    platt, auto = methods["platt"], methods[AUTO]
    return {
        "platt": dict(platt),
        AUTO: dict(auto),
        "brier_change_pct": 100.0 * (auto["brier"] / platt["brier"] - 1.0),
    }


def zero_label(evidence: Sequence[QueryEvidence], profile: Profile) -> dict[str, Any]:
    """A profile scored on judged queries it never saw, exactly as search serves it.

    ``interval_coverage``: share of the ``BINNING`` bins whose observed rate lies in
    the bin's mean interval (no intervals: zero width). ``abstain``: share of queries
    answered and the share of answered queries without a relevant hit (the risk a
    certified threshold would bound).
    """
    evidence = [e for e in evidence if len(e.scores)]
    scored = [
        profile.score(
            e.norm, e.n_tokens, e.scores, e.doc_norms, e.doc_tokens, e.lexical
        )
        for e in evidence
    ]
    y, p = labels_of(evidence), np.concatenate([s.probabilities for s in scored])
    bands = [s.intervals or (s.probabilities, s.probabilities) for s in scored]
    lo = np.concatenate([b[0] for b in bands])
    hi = np.concatenate([b[1] for b in bands])
    hit = np.array([float(labels_of([e]).max()) for e in evidence])
    answered = ~np.array([s.abstain for s in scored])
    base = float(y.mean())
    return {
        **_metrics(y, p),
        "base_rate": base,
        "constant_brier": base * (1.0 - base),
        "interval_coverage": interval_coverage(y, p, lo, hi, n_bins=BINNING.n_bins),
        "mean_interval_width": float(np.mean(hi - lo)),
        "abstain": {
            "answered": float(answered.mean()),
            "risk": float(1.0 - hit[answered].mean()) if answered.any() else None,
        },
    }


@dataclass(frozen=True)
class _HeldOut:
    """Probabilities of the evaluated pairs from models that never saw their labels."""

    protocol: str
    fit_pool: list[QueryEvidence]  # the queries the models are fitted on
    proba: dict[str, FloatArray]  # by method
    confidence: FloatArray | None  # query confidence (fit-split mode only)
    rank_proba: dict[str, list[FloatArray]]  # by method, per query of the ranking
    chosen: list[str]  # auto's choice, per fit
    chosen_query_side: list[str]


def _held_out(
    evidence: Sequence[QueryEvidence],
    doc_ref: NormReference,
    opts: EvalOptions,
    fit_evidence: Sequence[QueryEvidence] | None,
    progress: Progress | None,
    rank_evidence: Sequence[QueryEvidence],
) -> _HeldOut:
    """Nested CV on ``evidence``, or a fit on ``fit_evidence`` scored on it."""
    if fit_evidence is None:
        cv = _nested_cv(evidence, doc_ref, opts, progress, rank_evidence)
        return _HeldOut(
            protocol=f"{opts.n_splits}-fold nested cross-validation grouped by query",
            fit_pool=list(evidence),
            proba=cv.proba,
            confidence=None,
            rank_proba=cv.rank_proba,
            chosen=cv.chosen,
            chosen_query_side=cv.chosen_query_side,
        )
    fit_pool = [e for e in fit_evidence if len(e.scores)]
    if progress is not None:
        progress("fitting on the fitting split")
    fitted = _fit_predict(
        fit_pool, evidence, doc_ref, opts, with_confidence=True, rank_test=rank_evidence
    )
    bounds = _offsets(rank_evidence)
    return _HeldOut(
        protocol="fit on the fitting split, evaluated on the test split",
        fit_pool=fit_pool,
        proba=fitted.proba,
        confidence=fitted.confidence,
        rank_proba={
            m: [p[bounds[q] : bounds[q + 1]] for q in range(len(rank_evidence))]
            for m, p in fitted.rank_proba.items()
        },
        chosen=[fitted.chosen],
        chosen_query_side=(
            [] if fitted.chosen_query_side is None else [fitted.chosen_query_side]
        ),
    )


def _selection_on_all(
    fit_pool: Sequence[QueryEvidence],
    doc_ref: NormReference,
    opts: EvalOptions,
    progress: Progress | None,
) -> tuple[SelectionResult, SelectionResult | None]:
    """``auto`` on every fitting query (norm lift, choice), and query-side only."""
    if progress is not None:
        progress("norm lift on all fitting data")
    X_all, y_all, g_all = _pairs(fit_pool, query_reference(fit_pool), doc_ref)
    select = functools.partial(
        select_calibrator,
        X_all,
        y_all,
        g_all,
        method=AUTO,
        n_splits=min(opts.n_splits, len(fit_pool)),
        prior=opts.prior,
    )
    sel = select(query_side_only=False)
    return sel, select(query_side_only=True) if opts.query_side else None


def _evaluate_calibration(
    evidence: Sequence[QueryEvidence],
    doc_norms: FloatArray,
    doc_tokens: IntArray,
    options: EvalOptions | None,
    fit_evidence: Sequence[QueryEvidence] | None,
    progress: Progress | None,
    ranking: Sequence[RankingPool] | None = None,
) -> dict[str, Any]:
    opts = options or EvalOptions()
    if ranking is not None and len(ranking) != len(evidence):
        raise ValueError("ranking needs one pool per query of evidence")
    kept = [i for i, e in enumerate(evidence) if len(e.scores)]
    evidence = [evidence[i] for i in kept]
    pools = None if ranking is None else [ranking[i] for i in kept]
    rank_evidence = [] if pools is None else [p.evidence for p in pools]
    doc_ref = NormReference().fit(doc_norms, doc_tokens)
    y = labels_of(evidence)
    groups = np.repeat(
        np.arange(len(evidence), dtype=np.int64), [len(e.scores) for e in evidence]
    )
    # ell_q per pair from a label-free reference on all evaluated queries (terciles only)
    ell_q = build_features(evidence, query_reference(evidence), doc_ref)[0][:, ELL_Q]
    held = _held_out(evidence, doc_ref, opts, fit_evidence, progress, rank_evidence)
    proba = held.proba
    methods = {m: _metrics(y, p) for m, p in proba.items()}

    sel, sel_r = _selection_on_all(held.fit_pool, doc_ref, opts, progress)
    lift: dict[str, Any] = to_jsonable(sel.norm_lift)
    if sel_r is not None:
        lift["query_side"] = to_jsonable(sel_r.norm_lift)

    terciles = {
        m: to_jsonable(reliability_by_tercile(y, proba[m], ell_q))
        for m in ("platt", AUTO)
    }
    for t in terciles.values():
        t.pop("curves", None)

    few = few_label_curve(
        held.fit_pool,
        doc_ref,
        opts,
        test=None if fit_evidence is None else evidence,
        full_auto_proba=proba[AUTO] if fit_evidence is None else None,
        progress=progress,
    )
    platt_brier = methods["platt"]["brier"]
    retrieval = (
        {}
        if pools is None
        else {
            "retrieval": mode_rankings(
                pools,
                _query_folds(len(pools), opts.n_splits, opts.seed),
                held.rank_proba,
            )
        }
    )
    return {
        **retrieval,
        "protocol": held.protocol,
        "k": opts.k,
        "n_queries": len(evidence),
        "n_pairs": len(y),
        "n_positive": int(y.sum()),
        "n_fit_queries": len(held.fit_pool),
        "methods": methods,
        "chosen": sel.method,
        "selection": to_jsonable(sel.why),
        "chosen_per_fold": held.chosen,
        "chosen_query_side": None if sel_r is None else sel_r.method,
        "chosen_query_side_per_fold": held.chosen_query_side,
        "ece_noise_floor": {m: ece_noise_floor(proba[m]) for m in ("platt", AUTO)},
        "auto_vs_platt": {
            "brier_change_pct": 100.0 * (methods[AUTO]["brier"] / platt_brier - 1.0),
            "nll_change_pct": 100.0
            * (methods[AUTO]["nll"] / methods["platt"]["nll"] - 1.0),
        },
        "norm_lift": lift,
        "reliability_by_norm_tercile": terciles,
        "few_label": few,
        "query_level": _query_level(
            proba[AUTO], groups, ell_q, y, opts, confidence=held.confidence
        ),
    }
