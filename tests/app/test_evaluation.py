"""``normcal eval``: retrieval metrics, honest nested CV, the report and the CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from app.ops.evaluation import method_table, summary_table
from calibration import NormReference
from calibration.evaluation import (
    AUTO,
    EvalOptions,
    _query_folds,
    ece_noise_floor,
    evaluate_calibration,
    ndcg_at_k,
    nested_cv,
    recall_at_k,
    retrieval_metrics,
)
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
FAST = EvalOptions(few_label_sizes=(10,), few_label_draws=2, reorder=False)


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


def test_few_label_sizes_include_5_10_and_30_by_default() -> None:
    from app.ops.cli import build_parser

    args = build_parser().parse_args(["eval", "somewhere"])
    assert {5, 10, 30} <= set(args.few_label)
    assert {5, 10, 30} <= set(EvalOptions().few_label_sizes)


@pytest.mark.slow
def test_cli_eval_on_a_real_scifact_slice(
    tmp_path: Path, embedder, monkeypatch, capsys
) -> None:
    import app.api.lifespan
    from app.ops.cli import main

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
        "--no-reorder",
    ]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "| platt |" in printed and "| auto |" in printed
    result = json.loads(out.read_text(encoding="utf-8"))
    assert REQUIRED_KEYS <= set(result)
    assert result["dataset"] == "scifact-slice"
    assert result["n_queries"] == 30
    assert result["n_pairs"] == 30 * 20
    # every relevant document is in the slice, so dense retrieval finds many
    assert 0.3 < result["retrieval"]["ndcg@10"] <= 1
    assert 0.5 < result["retrieval"]["recall@100"] <= 1
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
