"""Fit the default calibration profile shipped for the default model: a cross-domain prior.

The profile is :func:`calibration.fit_prior` over the eight relevance sets of
``../shared/data`` (scifact, cranfield, cisi, cacm, npl, cf, time, aila-statutes; test
qrels, top-20 exact cosine retrieval, each set weighted equally, query-side features
only so hits are never reordered). Its report holds leave-one-dataset-out figures:
every held-out probability of set X comes from a prior fitted without X; the weight of
the coherent query confidence is fitted on them. Whether the residual query norm earns
a place in the prior is decided by the one-SE rule on the same held-out predictions.
No abstain threshold is certified (no collection's judgments).

The evidence of each set is cached by ``benchmarks/transfer.py``
(``~/.cache/normcal/transfer/<model>/``); missing sets are embedded with the real model.

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python scripts/fit_default_profile.py``
(writes ``app/profiles/<model>.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> int:
    from app.profiles import default_profile_path
    from app.settings import Settings
    from benchmarks.transfer import (
        CACHE,
        DATA,
        SETS,
        WITH_NORM,
        build_cache,
        load_cache,
        load_domain,
    )
    from benchmarks.transfer import _cache_file as cache_file
    from calibration import NormReference, fit_prior, norm_lift_verdict
    from calibration.prior import PRIOR_FEATURES
    from calibration.profile import prior_profile, single_threaded_blas
    from calibration.selection import NormLift

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--cache", type=Path, default=CACHE)
    args = parser.parse_args()

    settings = Settings()
    model = settings.model_name
    paths = {}
    embedder = None
    for name in SETS:
        path = cache_file(args.cache, model, name)
        if not path.exists():
            if embedder is None:
                from app.api.lifespan import load_embedder

                embedder = load_embedder(settings)
            path = build_cache(embedder, name, args.data, args.cache)
        paths[name] = path
    domains = {name: load_domain(name, paths[name]) for name in SETS}

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
        features = WITH_NORM if verdict.kept else PRIOR_FEATURES
        held = p_norm if verdict.kept else p_free
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
    caches = [load_cache(paths[n]) for n in SETS]
    evidence = [e for ev, _, _ in caches for e in ev]
    query_ref = NormReference().fit(
        np.array([e.norm for e in evidence]), np.array([e.n_tokens for e in evidence])
    )
    doc_ref = NormReference().fit(
        np.concatenate([c[1] for c in caches]), np.concatenate([c[2] for c in caches])
    )
    slug = default_profile_path(model).stem
    profile = prior_profile(
        prior,
        query_ref=query_ref,
        doc_ref=doc_ref,
        model=model,
        held_out=(y, held, groups),
        norm_lift=lift,
        profile_id=f"default-{slug}",
        extra_report={
            "source": f"cross-domain prior over {', '.join(SETS)} (test qrels)",
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
        f"  norm: {verdict.verdict}; confidence weight {profile.confidence_weight:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
