"""Fit the default calibration profile shipped for the default model: a cross-domain prior.

The profile is :func:`calibration.fit_prior` over the eight relevance sets of
``../shared/data`` (scifact, cranfield, cisi, cacm, npl, cf, time, aila-statutes; test
qrels, each set weighted equally) on the **hybrid pool of 20** per query: the exact
cosine top-20 and the BM25 top-20 (:func:`calibration.fusion.candidate_pool`, BM25 from
the product's FTS5 code), every hit with its lexical evidence. Its report holds
leave-one-dataset-out figures: every held-out probability of set X comes from a prior
fitted without X; the weight of the coherent query confidence is fitted on them.
Two evidence groups must earn their place by the one-SE rule on the same held-out
predictions (paired per-query NLL): first the residual query norm (``ell_q``) over the
list features, then the lexical columns (``lex``, ``lex_rel``, ``lex_rank``) over what
was kept. Lexical columns are document-side, so a profile that keeps them may reorder
hits (hybrid search ranks by probability). No abstain threshold is certified.

Corpus embeddings and the dense/BM25 lists are cached under ``~/.cache/normcal/corpus``
(the cache ``benchmarks/eval_all.py`` uses); missing sets are embedded with the real
model.

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python scripts/fit_default_profile.py``
(writes ``app/profiles/<model>.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")


K = 20
"""Hybrid pool size per query (dense top-20 + BM25 top-20), as ``normcal eval``."""


def hybrid_sets(data: Path, cache: Path) -> dict[str, tuple[list[Any], Any]]:
    """Per set: labelled hybrid-pool evidence and the embedded corpus."""
    from app.api.lifespan import load_embedder
    from app.cli.beir import embed_corpus, hybrid_retrieve, read_qrels, read_queries
    from app.settings import Settings
    from benchmarks.transfer import SETS
    from calibration.features import LEXICAL_DEPTH

    embedder = load_embedder(Settings())
    out = {}
    for name in SETS:
        corpus = embed_corpus(embedder, data / name, cache)
        queries = read_queries(data / name)
        qrels = read_qrels(data / name, "test")
        qids = sorted(q for q in qrels if q in queries)
        depth = min(LEXICAL_DEPTH, len(corpus.ids))
        hybrid = hybrid_retrieve(
            embedder, data / name, corpus, queries, qids, depth, cache
        )
        out[name] = (hybrid.evidence(corpus, qrels, K), corpus)
    return out


def main() -> int:
    from app.profiles import default_profile_path
    from app.settings import Settings
    from benchmarks.eval_all import CACHE
    from benchmarks.transfer import DATA, SETS, WITH_NORM, domain_of
    from calibration import NormReference, fit_prior, norm_lift_verdict
    from calibration.features import LEXICAL_FEATURES
    from calibration.prior import PRIOR_FEATURES
    from calibration.profile import prior_profile, single_threaded_blas
    from calibration.selection import NormLift

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--cache", type=Path, default=CACHE)
    args = parser.parse_args()

    from app.embedding.identity import model_identity

    model = Settings().model_name
    sets = hybrid_sets(args.data, args.cache)
    domains = {
        name: domain_of(name, ev, corpus.norms, corpus.n_tokens)
        for name, (ev, corpus) in sets.items()
    }

    def lodo(features: tuple[str, ...]) -> np.ndarray:
        """Held-out probabilities of every set from a prior fitted without it."""
        out = []
        for name, d in domains.items():
            others = {n: (o.X, o.y) for n, o in domains.items() if n != name}
            out.append(fit_prior(others, features=features).predict_proba(d.X))
        return np.concatenate(out)

    y = np.concatenate([d.y for d in domains.values()])
    offsets = np.cumsum([0] + [len(d.evidence) for d in domains.values()])
    groups = np.concatenate(
        [d.groups + off for d, off in zip(domains.values(), offsets, strict=False)]
    )
    with single_threaded_blas():
        p_free, p_norm = lodo(PRIOR_FEATURES), lodo(WITH_NORM)
        verdict = norm_lift_verdict(y, p_norm, p_free, groups)
        base = WITH_NORM if verdict.kept else PRIOR_FEATURES
        p_base = p_norm if verdict.kept else p_free
        with_lexical = (*base, *LEXICAL_FEATURES)
        p_lex = lodo(with_lexical)
        lexical = norm_lift_verdict(y, p_lex, p_base, groups)
        features = with_lexical if lexical.kept else base
        held = p_lex if lexical.kept else p_base
        prior = fit_prior(
            {n: (d.X, d.y) for n, d in domains.items()}, features=features
        )
    lift = NormLift(
        base_method="prior",
        nll_with=verdict.nll_with,
        nll_without=verdict.nll_without,
        brier_with=float(np.mean((p_norm - y) ** 2)),
        brier_without=float(np.mean((p_free - y) ** 2)),
        norm_signal=verdict.kept,
        reason=f"{verdict.verdict}: the residual query norm in the prior, "
        "leave-one-dataset-out, by one SE of the paired per-query NLL difference.",
    )
    lexical_lift = {
        "features": list(LEXICAL_FEATURES),
        "kept": lexical.kept,
        "verdict": lexical.verdict,
        "nll_with": lexical.nll_with,
        "nll_without": lexical.nll_without,
        "brier_with": float(np.mean((p_lex - y) ** 2)),
        "brier_without": float(np.mean((p_base - y) ** 2)),
        "how": "leave-one-dataset-out, one SE of the paired per-query NLL difference, "
        "over the features kept before it",
    }
    evidence = [e for ev, _ in sets.values() for e in ev]
    query_ref = NormReference().fit(
        np.array([e.norm for e in evidence]), np.array([e.n_tokens for e in evidence])
    )
    doc_ref = NormReference().fit(
        np.concatenate([c.norms for _, c in sets.values()]),
        np.concatenate([c.n_tokens for _, c in sets.values()]),
    )
    slug = default_profile_path(model).stem
    profile = prior_profile(
        prior,
        query_ref=query_ref,
        doc_ref=doc_ref,
        model=model,
        model_id=model_identity(Settings().model_path),  # applies to these files only
        held_out=(y, held, groups),
        norm_lift=lift,
        profile_id=f"default-{slug}",
        extra_report={
            "source": f"cross-domain prior over {', '.join(SETS)} (test qrels, "
            f"hybrid pool of {K}: dense top-{K} + BM25 top-{K})",
            "lexical_lift": lexical_lift,
            "script": "scripts/fit_default_profile.py",
        },
    )
    out = default_profile_path(model)
    out.write_text(json.dumps(profile.to_json(), indent=1, sort_keys=True) + "\n")
    m = profile.report.cv["prior"]
    print(f"wrote {out.relative_to(REPO)}: prior over {len(SETS)} sets")
    print(
        f"  leave-one-dataset-out nll {m.nll:.4f} brier {m.brier:.4f} ece {m.ece:.4f}"
    )
    print(
        f"  norm: {verdict.verdict}; lexical: {lexical.verdict}; "
        f"confidence weight {profile.confidence_weight:.3f}"
    )
    print(f"  features: {', '.join(features)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
