"""``normcal eval``: retrieval metrics, honest nested CV, the report and the CLI."""

from __future__ import annotations

import json
import math
from dataclasses import replace as dataclass_replace
from pathlib import Path

import numpy as np
import pytest

from app.cli.evaluation import method_table, summary_table
from calibration import NormReference
from calibration.evaluation import (
    AUTO,
    EvalOptions,
    RankingPool,
    _nested_cv,
    _query_folds,
    ece_noise_floor,
    evaluate_calibration,
    mode_order,
    mode_rankings,
    ndcg_at_k,
    nested_cv,
    paired_gain,
    recall_at_k,
    retrieval_metrics,
    tune_blend,
)
from calibration.features import LEXICAL_DEPTH, LexicalEvidence
from calibration.profile import QueryEvidence
from tests.conftest import shared_dataset

REQUIRED_KEYS = {
    "dataset",
    "retrieval",
    "methods",
    "chosen",
    "norm_lift",
    "few_label",
    "query_level",
}
FAST = EvalOptions(few_label_sizes=(10,), few_label_draws=2, query_side=False)


# -- retrieval metrics against a hand-computed oracle ----------------------------------
def test_ndcg_and_recall_match_hand_computation() -> None:
    judged = {"b": 2, "e": 1, "a": 0, "x": 0}  # explicit 0 rows, graded gains
    ranked = ["a", "b", "c", "d"]
    dcg = 2 / math.log2(3)  # b at rank 2
    idcg = 2 / math.log2(2) + 1 / math.log2(3)  # ideal: b (2) then e (1)
    assert ndcg_at_k(ranked, judged, 10) == pytest.approx(dcg / idcg)
    assert ndcg_at_k(["b", "e"], judged, 10) == pytest.approx(1.0)
    assert ndcg_at_k(["e", "b"], judged, 1) == pytest.approx(0.5)  # 1 / 2
    assert recall_at_k(ranked, judged, 100) == pytest.approx(0.5)
    assert recall_at_k(ranked, judged, 1) == 0.0
    assert math.isnan(ndcg_at_k(ranked, {"a": 0}, 10))  # no relevant document


def test_retrieval_metrics_average_queries_with_relevant_documents() -> None:
    qrels = {"q1": {"b": 1}, "q2": {"z": 1}, "q3": {"a": 0}}
    ranked = {"q1": ["b", "c"], "q2": ["c", "b"], "q3": ["a"]}
    out = retrieval_metrics(ranked, qrels)
    assert out["n_queries"] == 3
    assert out["n_queries_with_relevant"] == 2
    assert out["ndcg@10"] == pytest.approx(0.5)  # 1 and 0
    assert out["recall@100"] == pytest.approx(0.5)


# -- retrieval modes over one shared pool -------------------------------------------------
def hand_pool(judged: dict[str, int] | None = None) -> RankingPool:
    """Dense list a, b, c (cosine order); BM25 list c, d, a; d is BM25-only."""
    evidence = QueryEvidence(
        norm=1.0,
        n_tokens=5,
        scores=np.array([0.9, 0.8, 0.7, 0.1]),
        doc_norms=np.ones(4),
        doc_tokens=np.full(4, 10),
        labels=np.zeros(4),
        lexical=LexicalEvidence(
            bm25=np.array([2.0, 0.0, 9.0, 5.0]),
            rank=np.array([3.0, LEXICAL_DEPTH + 1, 1.0, 2.0]),
            idf_mass=10.0,
            top=9.0,
        ),
    )
    return RankingPool("q", ["a", "b", "c", "d"], evidence, 3, 3, judged or {})


def test_every_mode_orders_the_same_pool_as_computed_by_hand() -> None:
    pool = hand_pool()
    assert mode_order(pool, "dense") == ["a", "b", "c", "d"]
    assert mode_order(pool, "lexical") == ["c", "d", "a", "b"]
    # rrf: a 1/61+1/63, c 1/63+1/61 (tie: dense order), d 1/62, b 1/62 (tie: dense)
    assert mode_order(pool, "rrf") == ["a", "c", "b", "d"]
    # blend, cosine weight 1 and 0: the two lists' own orders
    assert mode_order(pool, "blend", weight=1.0) == ["a", "b", "c", "d"]
    assert mode_order(pool, "blend", weight=0.0) == ["c", "d", "a", "b"]
    proba = np.array([0.1, 0.2, 0.3, 0.9])
    assert mode_order(pool, "hybrid", proba=proba) == ["d", "c", "b", "a"]
    with pytest.raises(ValueError):
        mode_order(pool, "hybrid")


def test_blend_weight_is_tuned_on_other_queries_only() -> None:
    lexical_wins = [hand_pool({"d": 1}) for _ in range(4)]  # only BM25 ranks d high
    dense_wins = [hand_pool({"b": 1}) for _ in range(4)]  # only the cosine ranks b high
    assert tune_blend(lexical_wins) < 0.5 < tune_blend(dense_wins)
    pools = [
        RankingPool(f"q{i}", p.docs, p.evidence, 3, 3, p.judged)
        for i, p in enumerate(lexical_wins + dense_wins)
    ]
    folds = [np.arange(4, dtype=np.int64), np.arange(4, 8, dtype=np.int64)]
    out = mode_rankings(pools, folds, {AUTO: [np.zeros(4)] * 8})
    assert set(out) >= {"dense", "lexical", "rrf", "blend", "calibrated", "pool"}
    # each fold's weight comes from the other fold, whose winner is the other list
    low, high = out["blend"]["cosine_weight_per_fold"]
    assert high < 0.5 < low
    assert out["blend"]["ndcg@10"] < min(out["dense"]["ndcg@10"], 1.0)


def test_paired_gain_is_the_mean_per_query_difference_with_its_standard_error() -> None:
    judged = {"q1": {"a": 1}, "q2": {"b": 1}, "q3": {"a": 1}, "none": {}}
    mine = {"q1": ["a", "b"], "q2": ["b", "a"], "q3": ["b", "a"], "none": ["a"]}
    base = {"q1": ["b", "a"], "q2": ["b", "a"], "q3": ["a", "b"], "none": ["b"]}
    second = 1 / math.log2(3)  # nDCG@10 of the one relevant document in 2nd place
    diff = np.array([1 - second, 0.0, second - 1])  # "none" has no relevant document
    out = paired_gain(mine, base, judged)
    assert out["n_queries"] == 3
    assert out["gain"] == pytest.approx(0.0)
    assert out["se"] == pytest.approx(diff.std(ddof=1) / math.sqrt(3))
    one = paired_gain({"q1": ["a"]}, {"q1": ["b"]}, judged)
    assert one == {"gain": 1.0, "se": None, "n_queries": 1}  # no spread to measure


def test_the_calibrated_ranking_reports_its_gain_over_each_fusion() -> None:
    pools = [
        RankingPool(f"q{i}", p.docs, p.evidence, 3, 3, p.judged)
        for i, p in enumerate(hand_pool({d: 1}) for d in "abcdabcd")
    ]
    folds = [np.arange(4, dtype=np.int64), np.arange(4, 8, dtype=np.int64)]
    proba = np.array([0.1, 0.2, 0.3, 0.9])  # orders d, c, b, a
    out = mode_rankings(pools, folds, {AUTO: [proba] * 8})
    gains = out["calibrated"]["gain_over"]
    assert set(gains) == {"dense", "rrf", "blend"}
    for mode, gain in gains.items():  # every query has a relevant document
        assert gain["n_queries"] == 8
        assert gain["gain"] == pytest.approx(
            out["calibrated"]["ndcg@10"] - out[mode]["ndcg@10"]
        )
        assert gain["se"] > 0


# -- calibration on synthetic evidence --------------------------------------------------
def synthetic_evidence(n_queries: int = 40, k: int = 10, seed: int = 0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_queries):
        scores = np.sort(rng.uniform(0.2, 0.8, k))[::-1]
        p = 1 / (1 + np.exp(-(12 * (scores - 0.6))))
        out.append(
            QueryEvidence(
                norm=float(rng.lognormal(1.0, 0.1)),
                n_tokens=int(rng.integers(5, 30)),
                scores=scores,
                doc_norms=rng.lognormal(1.0, 0.1, k),
                doc_tokens=rng.integers(20, 300, k),
                labels=(rng.uniform(size=k) < p).astype(float),
            )
        )
    return out


def with_pools(evidence, extra: int = 5, seed: int = 4):
    """Each query's evidence with BM25 evidence, and a deeper ranking pool of it."""
    rng = np.random.default_rng(seed)
    out, pools = [], []
    for i, e in enumerate(evidence):
        assert e.labels is not None
        k = len(e.scores)
        bm25 = np.where(e.labels > 0, rng.uniform(3, 9, k), rng.uniform(0, 4, k))
        lex = LexicalEvidence(
            bm25, np.argsort(np.argsort(-bm25)) + 1.0, 12.0, float(bm25.max())
        )
        out.append(dataclass_replace(e, lexical=lex))
        more = np.sort(rng.uniform(0.0, e.scores.min(), extra))[::-1]
        deep = QueryEvidence(
            e.norm,
            e.n_tokens,
            np.concatenate([e.scores, more]),
            np.concatenate([e.doc_norms, rng.lognormal(1.0, 0.1, extra)]),
            np.concatenate([e.doc_tokens, rng.integers(20, 300, extra)]),
            np.concatenate([e.labels, np.zeros(extra)]),
            LexicalEvidence(
                np.concatenate([bm25, np.zeros(extra)]),
                np.concatenate([lex.rank, np.full(extra, LEXICAL_DEPTH + 1.0)]),
                12.0,
                float(bm25.max()),
            ),
        )
        docs = [f"d{i}-{j}" for j in range(k + extra)]
        judged = {d: int(y) for d, y in zip(docs, e.labels, strict=False) if y > 0}
        pools.append(RankingPool(f"q{i}", docs, deep, k, k + extra, judged))
    return out, pools


def corpus_sample(seed: int = 1):
    rng = np.random.default_rng(seed)
    return rng.lognormal(1.0, 0.1, 500), rng.integers(20, 300, 500)


def test_ece_noise_floor_shrinks_with_more_pairs() -> None:
    rng = np.random.default_rng(0)
    small, large = rng.uniform(0, 0.4, 500), rng.uniform(0, 0.4, 20000)
    assert 0 < ece_noise_floor(large, n_sims=20) < ece_noise_floor(small, n_sims=20)
    assert ece_noise_floor(small, n_sims=20) < 0.1


def test_nested_cv_predicts_every_pair_without_seeing_its_labels() -> None:
    evidence = synthetic_evidence()
    doc_ref = NormReference().fit(*corpus_sample())
    proba, chosen, _ = nested_cv(evidence, doc_ref, FAST)
    n_pairs = sum(len(e.scores) for e in evidence)
    assert set(proba) == {"platt", "isotonic", "nt", "nt-list", AUTO}
    for p in proba.values():
        assert p.shape == (n_pairs,)
        assert np.all(np.isfinite(p))
        assert np.all((p >= 0) & (p <= 1))
    assert len(chosen) == FAST.n_splits

    # Flipping the labels of the first outer fold's queries must not change that
    # fold's predictions: nothing (auto's inner selection included) saw them.
    fold = _query_folds(len(evidence), FAST.n_splits, FAST.seed)[0]
    flipped = list(evidence)
    for q in fold:
        e = evidence[q]
        assert e.labels is not None
        flipped[q] = QueryEvidence(
            e.norm, e.n_tokens, e.scores, e.doc_norms, e.doc_tokens, 1 - e.labels
        )
    proba2, _, _ = nested_cv(flipped, doc_ref, FAST)
    offsets = np.concatenate([[0], np.cumsum([len(e.scores) for e in evidence])])
    rows = np.concatenate([np.arange(offsets[q], offsets[q + 1]) for q in fold])
    for method in proba:
        np.testing.assert_allclose(proba[method][rows], proba2[method][rows])


def test_calibrated_ranking_of_a_fold_never_saw_its_labels() -> None:
    evidence, pools = with_pools(synthetic_evidence())
    doc_ref = NormReference().fit(*corpus_sample())
    rank = [p.evidence for p in pools]
    cv = _nested_cv(evidence, doc_ref, FAST, rank_evidence=rank)
    assert [len(p) for p in cv.rank_proba[AUTO]] == [len(e.scores) for e in rank]
    fold = _query_folds(len(evidence), FAST.n_splits, FAST.seed)[0]
    flipped = list(evidence)
    for q in fold:
        e = evidence[q]
        assert e.labels is not None
        flipped[q] = dataclass_replace(e, labels=1 - e.labels)
    cv2 = _nested_cv(flipped, doc_ref, FAST, rank_evidence=rank)
    for q in fold:
        np.testing.assert_allclose(cv.rank_proba[AUTO][q], cv2.rank_proba[AUTO][q])


def test_evaluate_calibration_reports_every_mode_and_both_pools() -> None:
    evidence, pools = with_pools(synthetic_evidence())
    dense = [dataclass_replace(e, lexical=None) for e in evidence]
    out = evaluate_calibration(
        evidence, *corpus_sample(), FAST, ranking=pools, dense_evidence=dense
    )
    modes = out["retrieval"]
    assert {"dense", "lexical", "rrf", "blend", "calibrated"} <= set(modes)
    for name in ("dense", "lexical", "rrf", "blend", "calibrated"):
        assert 0 <= modes[name]["ndcg@10"] <= 1
        assert modes[name]["n_queries"] == 40
    # BM25 here is built from the labels: the lexical list beats the cosine
    assert modes["lexical"]["ndcg@10"] > modes["dense"]["ndcg@10"]
    by_pool = out["calibration_by_pool"]
    assert set(by_pool) == {"hybrid", "dense"}
    assert by_pool["hybrid"]["auto"] == out["methods"][AUTO]
    for pool in by_pool.values():
        assert pool["brier_change_pct"] == pytest.approx(
            100 * (pool["auto"]["brier"] / pool["platt"]["brier"] - 1)
        )
    assert "pool" in modes
    json.dumps(out)
    assert "| calibrated |" in method_table(
        {**out, "dataset": "synthetic", "retrieval": modes}
    )
    with pytest.raises(ValueError):
        evaluate_calibration(evidence, *corpus_sample(), FAST, ranking=pools[:3])


def test_evaluate_calibration_report_is_complete_and_in_range() -> None:
    evidence = synthetic_evidence()
    out = evaluate_calibration(evidence, *corpus_sample(), FAST)
    assert {"methods", "chosen", "norm_lift", "few_label", "query_level"} <= set(out)
    assert set(out["methods"]) == {"platt", "isotonic", "nt", "nt-list", AUTO}
    for m in out["methods"].values():
        assert 0 <= m["ece"] <= 1
        assert 0 <= m["brier"] <= 1
        assert m["nll"] > 0
        assert 0 <= m["auroc"] <= 1
    assert out["methods"]["platt"]["auroc"] > 0.7  # labels follow the score
    assert out["n_pairs"] == 400
    assert 0 < out["ece_noise_floor"][AUTO] < 0.2
    assert out["chosen"] in {"platt", "isotonic", "nt", "nt-list"}
    assert "terms" in out["norm_lift"]
    few = out["few_label"]["sizes"]["10"]
    assert few["n_draws"] == 2
    assert few["auto_brier_vs_full"] > 0
    ql = out["query_level"]
    assert ql["n_queries"] == 40
    terciles = out["reliability_by_norm_tercile"]
    assert set(terciles) == {"platt", AUTO}
    assert len(terciles[AUTO]["ece"]) == 3
    json.dumps(out)  # JSON-able (NaN mapped to None)


def test_fit_split_mode_evaluates_on_the_other_queries() -> None:
    fit = synthetic_evidence(40, seed=2)
    test = synthetic_evidence(20, seed=3)
    out = evaluate_calibration(test, *corpus_sample(), FAST, fit_evidence=fit)
    assert out["n_queries"] == 20
    assert out["n_fit_queries"] == 40
    assert out["few_label"]["full_data"]["auto"]["brier"] > 0
    assert out["protocol"].startswith("fit on")


# -- the real pipeline on a scifact slice, through the CLI ------------------------------
def scifact_slice(tmp_path: Path, n_queries: int = 30, n_extra: int = 40) -> Path:
    src = shared_dataset("scifact")
    rows = (src / "qrels" / "test.tsv").read_text(encoding="utf-8").splitlines()
    qrels: dict[str, dict[str, str]] = {}
    for line in rows[1:]:
        q, d, s = line.split("\t")
        if q in qrels or len(qrels) < n_queries:
            qrels.setdefault(q, {})[d] = s
    wanted = {d for docs in qrels.values() for d in docs}
    dst = tmp_path / "scifact-slice"
    (dst / "qrels").mkdir(parents=True)
    kept = []
    with (src / "corpus.jsonl").open(encoding="utf-8") as fh:
        for line in fh:
            doc_id = str(json.loads(line)["_id"])
            if doc_id in wanted or len(kept) < len(wanted) + n_extra:
                kept.append(line)
    (dst / "corpus.jsonl").write_text("".join(kept), encoding="utf-8")
    with (src / "queries.jsonl").open(encoding="utf-8") as fh:
        queries = [ln for ln in fh if str(json.loads(ln)["_id"]) in qrels]
    (dst / "queries.jsonl").write_text("".join(queries), encoding="utf-8")
    (dst / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n"
        + "".join(
            f"{q}\t{d}\t{s}\n" for q, docs in qrels.items() for d, s in docs.items()
        ),
        encoding="utf-8",
    )
    return dst


def test_a_corpus_cache_is_read_only_by_the_model_files_and_precision_it_holds(
    tmp_path: Path,
) -> None:
    """Keyed by the configured name alone, the cache served one model's vectors to
    another model under the same name, and fp32 vectors to a mixed-precision run."""
    from app.cli.beir import corpus_is_cached, embed_corpus
    from app.embedding.precision import PrecisionChoice
    from tests.support.fakes import HashEmbedder

    data = tmp_path / "set"
    data.mkdir()
    rows = [{"_id": f"d{i}", "title": "", "text": f"text {i}"} for i in range(3)]
    (data / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cache = tmp_path / "cache"
    first = HashEmbedder(model_name="m", model_id="files-a")
    stored = embed_corpus(first, data, cache)
    assert corpus_is_cached(first, data, cache)
    same = HashEmbedder(model_name="m", model_id="files-a")
    np.testing.assert_array_equal(
        embed_corpus(same, data, cache).vectors, stored.vectors
    )
    other_files = HashEmbedder(model_name="m", model_id="files-b", dim=16)
    assert not corpus_is_cached(other_files, data, cache)
    assert embed_corpus(other_files, data, cache).vectors.shape == (3, 16)
    mixed = HashEmbedder(model_name="m", model_id="files-a")
    mixed.precision_choice = PrecisionChoice("mixed", "a test's")  # type: ignore[attr-defined]
    assert not corpus_is_cached(mixed, data, cache)
    assert len(list(cache.glob("set-*.npz"))) == 2


def test_few_label_sizes_include_5_10_and_30_by_default() -> None:
    from app.cli.main import build_parser

    args = build_parser().parse_args(["eval", "somewhere"])
    assert {5, 10, 30} <= set(args.few_label)
    assert {5, 10, 30} <= set(EvalOptions().few_label_sizes)


@pytest.mark.slow
def test_cli_eval_on_a_real_scifact_slice(
    tmp_path: Path, embedder, monkeypatch, capsys
) -> None:
    import app.api.lifespan
    from app.cli.main import main

    data = scifact_slice(tmp_path)
    monkeypatch.setattr(app.api.lifespan, "load_embedder", lambda _settings: embedder)
    out = tmp_path / "report.json"
    args = [
        "eval",
        str(data),
        "--json",
        str(out),
        "--cache-dir",
        str(tmp_path / "cache"),
        "--few-label",
        "10",
        "--draws",
        "2",
        "--no-query-side",
    ]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "| platt |" in printed and "| auto |" in printed
    result = json.loads(out.read_text(encoding="utf-8"))
    assert REQUIRED_KEYS <= set(result)
    assert result["dataset"] == "scifact-slice"
    assert result["n_queries"] == 30
    # every relevant document is in the slice, so dense retrieval finds many
    modes = result["retrieval"]
    for name in ("dense", "lexical", "rrf", "blend", "calibrated"):
        assert modes[name]["n_queries"] == 30
        # every relevant document is in the slice, so every list finds many
        assert 0.3 < modes[name]["ndcg@10"] <= 1
        assert 0.5 < modes[name]["recall@100"] <= 1
    for mode in ("dense", "rrf", "blend"):  # paired gains, printed beside the modes
        assert modes["calibrated"]["gain_over"][mode]["n_queries"] == 30
        gain = modes["calibrated"]["gain_over"][mode]["gain"]
        assert f"| {mode} | " in printed and f"{gain:+.4f} ± " in printed
    assert result["n_pairs"] >= 30 * 20  # hybrid pools: dense top-20 + BM25 top-20
    assert set(result["calibration_by_pool"]) == {"hybrid", "dense"}
    for name in ("platt", "isotonic", "nt", "nt-list", AUTO):
        m = result["methods"][name]
        assert 0 <= m["ece"] <= 1 and 0 <= m["brier"] <= 1 and m["nll"] > 0
        assert 0.5 < m["auroc"] <= 1
    zero = result["zero_label"]  # the shipped default, no judgments from the slice
    assert {
        "ece",
        "brier",
        "nll",
        "auroc",
        "base_rate",
        "constant_brier",
        "interval_coverage",
        "mean_interval_width",
        "abstain",
    } <= set(zero)
    assert 0 <= zero["interval_coverage"] <= 1 and zero["mean_interval_width"] > 0
    assert zero["constant_brier"] == pytest.approx(
        zero["base_rate"] * (1 - zero["base_rate"])
    )
    assert 0 <= zero["abstain"]["answered"] <= 1
    assert summary_table([result]).count("\n") == 3
    assert "scifact-slice" in method_table(result)
    # the corpus embedding is cached: a second run does not embed documents again
    assert list((tmp_path / "cache").glob("scifact-slice-*.npz"))


def test_eval_depth_is_passed_on_from_k_to_the_bm25_depth_and_refused_outside(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    import app.cli.evaluation
    from app.cli.main import EXIT_USAGE, MAX_EVAL_DEPTH, main

    assert MAX_EVAL_DEPTH == LEXICAL_DEPTH
    data = tmp_path / "tiny"
    (data / "qrels").mkdir(parents=True)
    (data / "corpus.jsonl").write_text('{"_id": "d1", "text": "a"}\n', "utf-8")
    (data / "queries.jsonl").write_text('{"_id": "q1", "text": "a"}\n', "utf-8")
    (data / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\nq1\td1\t1\n", "utf-8"
    )
    seen: list[int] = []

    def run_eval(*_args, options: EvalOptions, **_kwargs):
        seen.append(options.depth)
        raise SystemExit(0)  # the options are all this test reads

    monkeypatch.setattr(app.cli.evaluation, "run_eval", run_eval)
    for depth in ("20", str(LEXICAL_DEPTH)):  # --k (20) and the BM25 depth: accepted
        with pytest.raises(SystemExit):
            main(["eval", str(data), "--depth", depth])
    assert seen == [20, LEXICAL_DEPTH]
    for depth, k in ((str(LEXICAL_DEPTH + 1), "20"), ("9", "10")):  # one past each
        assert main(["eval", str(data), "--k", k, "--depth", depth]) == EXIT_USAGE
        assert f"--depth must be from --k ({k}) to 100; got {depth}" in (
            capsys.readouterr().err
        )
    assert seen == [20, LEXICAL_DEPTH]


@pytest.mark.slow
def test_hybrid_pools_hold_the_product_bm25_and_the_exact_lists(
    tmp_path: Path, embedder
) -> None:
    from app.cli.beir import (
        embed_corpus,
        hybrid_retrieve,
        lexical_index,
        retrieve,
    )
    from app.cli.inputs import read_qrels, read_queries
    from app.collections import lexical
    from calibration.fusion import candidate_pool

    data = scifact_slice(tmp_path, n_queries=8, n_extra=150)
    corpus = embed_corpus(embedder, data)
    queries, qrels = read_queries(data), read_qrels(data, "test")
    qids = sorted(qrels)
    cache = tmp_path / "cache"
    hybrid = hybrid_retrieve(embedder, data, corpus, queries, qids, 50, cache)
    again = hybrid_retrieve(embedder, data, corpus, queries, qids, 50, cache)
    np.testing.assert_array_equal(again.pool_bm25, hybrid.pool_bm25)  # cached
    conn = lexical_index(data, corpus.ids)
    flat = retrieve(embedder, corpus, queries, qids, 10)
    evidence = hybrid.evidence(corpus, qrels, 10)
    dense_only = hybrid.evidence(corpus, qrels, 10, hybrid=False)
    for i, q in enumerate(qids):
        hits = lexical.search(conn, queries[q], LEXICAL_DEPTH)
        dense, lex = hybrid.lists(i)
        assert lex == hits.seqs.tolist()
        rows = candidate_pool(dense, lex, 10)
        e = evidence[i]
        assert e.lexical is not None
        np.testing.assert_allclose(
            e.lexical.bm25, lexical.bm25_of(conn, queries[q], rows)
        )
        assert e.lexical.top == pytest.approx(float(hits.scores[0]))
        assert e.lexical.idf_mass == pytest.approx(lexical.idf_mass(conn, queries[q]))
        assert len(dense_only[i].scores) == 10
        np.testing.assert_allclose(dense_only[i].scores, e.scores[:10])
        # pool cosines are the exact (FAISS flat) cosines of the dense list
        np.testing.assert_allclose(e.scores[:10], flat.scores[i, :10], atol=1e-5)
        # lexical-only members come after the dense ones with lower cosines
        assert e.scores[10:].max(initial=-1) <= e.scores[:10].min() + 1e-6


@pytest.mark.slow
@pytest.mark.timeout(900)  # three evaluations and a fit (~5 min on a busy 2-core box)
def test_eval_of_a_served_collection_matches_the_local_eval(
    tmp_path: Path, embedder, monkeypatch, capsys
) -> None:
    """``--collection``: the same tables from the server's lists, nothing embedded."""
    import httpx

    import app.api.lifespan
    from app.api.app import create_app
    from app.cli.main import EXIT_INPUT, main
    from app.settings import Settings
    from tests.support.corpus import CORPUS
    from tests.support.live import ThreadServer

    data = scifact_slice(tmp_path)
    options = ["--few-label", "10", "--draws", "1", "--folds", "3", "--no-query-side"]
    monkeypatch.setattr(app.api.lifespan, "load_embedder", lambda _settings: embedder)
    local = tmp_path / "local.json"
    cache = ["--cache-dir", str(tmp_path / "cache")]
    assert main(["eval", str(data), "--json", str(local), *cache, *options]) == 0

    def no_embedding(_settings):
        raise AssertionError("eval --collection embeds nothing")

    monkeypatch.setattr(app.api.lifespan, "load_embedder", no_embedding)
    settings = Settings(data_dir=tmp_path / "data")
    with ThreadServer(create_app(settings, embedder=embedder)) as server:
        url = ["--url", server.url]
        assert main(["ingest", str(data), "--collection", "sci", *url]) == 0
        capsys.readouterr()
        served_json = tmp_path / "served.json"
        argv = ["eval", str(data), "--collection", "sci", *url, *options]
        assert main([*argv, "--json", str(served_json)]) == 0
        printed = capsys.readouterr().out
        a = json.loads(local.read_text(encoding="utf-8"))
        b = json.loads(served_json.read_text(encoding="utf-8"))
        assert b["collection"] == "sci" and b["missing_documents"] == 0
        assert (b["n_queries"], b["n_pairs"], b["n_positive"]) == (
            a["n_queries"],
            a["n_pairs"],
            a["n_positive"],
        )
        assert b["n_documents"] == a["n_documents"]
        for method in ("platt", AUTO):
            for metric in ("brier", "nll", "auroc"):
                assert b["methods"][method][metric] == pytest.approx(
                    a["methods"][method][metric], rel=2e-3
                ), (method, metric)
        for mode in ("dense", "lexical", "rrf"):
            assert b["retrieval"][mode]["ndcg@10"] == pytest.approx(
                a["retrieval"][mode]["ndcg@10"], abs=2e-3
            ), mode
        # The calibrator it serves (the shipped default here), scored as served:
        # reproduced from the lists to the last digit, beside what a fit gives.
        served = b["served"]
        assert served["default"] is True and served["reproduced"] < 1e-6
        assert served["brier"] == pytest.approx(b["zero_label"]["brier"])
        assert 0 < b["retrieval"]["served"]["ndcg@10"] <= 1
        assert f"| served: {served['id']} (the shipped default) |" in printed
        assert "Served probabilities reproduced from these lists" in printed

        # A fitted calibrator serves: it is the one scored, and in-sample is said.
        fit = ["fit", str(data), "--collection", "sci", *url, "--method", "platt"]
        assert main(fit) == 0
        capsys.readouterr()
        assert main(argv) == 0
        printed = capsys.readouterr().out
        assert "(platt) |" in printed and "its figures are in-sample" in printed

        # A collection of other documents: said in one line, exit 3.
        other = {"documents": [{"id": k, "text": t} for k, t in CORPUS.items()]}
        httpx.post(f"{server.url}/v1/collections", json={"name": "kb"})
        httpx.put(f"{server.url}/v1/collections/kb/documents", json=other)
        code = main(["eval", str(data), "--collection", "kb", *url])
        err = capsys.readouterr().err
        assert code == EXIT_INPUT, err
        assert "none of the" in err and "is in collection 'kb'" in err
        assert "'aspirin'" in err  # what it holds instead
