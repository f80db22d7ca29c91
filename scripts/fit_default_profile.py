"""Fit the default calibration profile shipped for the default model.

Public training judgments only: BEIR SciFact *train* qrels (809 queries) over the
SciFact corpus, top-20 exact cosine retrieval, ``method="auto"`` with 5-fold grouped CV,
query-side terms only (never reorders hits), abstain target 10% at δ = 0.1. The fit is
deterministic: re-running it reproduces the same parameters.

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python scripts/fit_default_profile.py``
(needs ``../shared/data/scifact``; writes ``app/profiles/<model>.json``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> int:
    from app.api.lifespan import load_embedder
    from app.ops.beir import embed_corpus, read_qrels, read_queries, retrieve
    from app.profiles import default_profile_path
    from app.settings import Settings
    from calibration.profile import fit_profile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data", type=Path, default=REPO.parent / "shared/data/scifact"
    )
    parser.add_argument("--split", default="train")
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--cache-dir", type=Path, default=REPO / ".normcal-cache")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    settings = Settings()
    embedder = load_embedder(settings)
    corpus = embed_corpus(embedder, args.data, args.cache_dir)
    qrels = read_qrels(args.data, args.split)
    query_ids = sorted(qrels)
    retrieval = retrieve(embedder, corpus, read_queries(args.data), query_ids, args.k)
    slug = default_profile_path(embedder.model_name).stem
    profile = fit_profile(
        retrieval.evidence(corpus, qrels, args.k),
        doc_norms=corpus.norms,
        doc_tokens=corpus.n_tokens,
        model=embedder.model_name,
        method="auto",
        allow_reorder=False,
        abstain_target=0.1,
        profile_id=f"default-{slug}",
        extra_report={
            "source": f"BEIR {args.data.name} {args.split} qrels, {len(query_ids)} queries",
            "script": "scripts/fit_default_profile.py",
        },
    )
    profile.default = True
    out = default_profile_path(embedder.model_name)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(profile.to_json(), indent=1, sort_keys=True) + "\n")
    cv = profile.report.cv
    print(f"wrote {out.relative_to(REPO)}: method {profile.method}")
    for name, m in cv.items():
        print(f"  {name:9s} nll {m.nll:.4f} brier {m.brier:.4f} ece {m.ece:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
