"""Fit the shipped default for other retrievers' candidate lists (``POST /v1/rerank``).

``app/profiles/external/<model>.json`` is :func:`calibration.fit_prior` over every
(set, retriever) domain of :mod:`benchmarks.external` — the fourteen shared relevance
sets, each retrieved by six simulated retrievers of varying quality (BM25, dense
MiniLM, paraphrase-MiniLM-L3 and mpnet, RRF of mpnet and BM25, BM25 on the first ten
words), lists of 20 — each domain weighted equally, on the features the ladder of
:mod:`benchmarks.external_transfer` kept (``--features`` to name them).

Its weight of the input order, served level and interval width are chosen with every
domain **held out twice**: scored by a prior fitted without its set and without its
retriever. The order weight (:func:`calibration.external.favour_input_order`) is the
smallest at which every held-out domain's returned nDCG@10 is at least its input
order's minus 0.01; the level the offset that minimises the mean held-out Brier score
over that of a constant at each domain's own base rate; the width the smallest at
which every held-out domain's interval coverage reaches 80%. The report holds those
held-out figures.

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python scripts/fit_rerank_profile.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from app.embedding.identity import model_identity  # noqa: E402
from app.profiles import external_profile_path  # noqa: E402
from app.settings import Settings  # noqa: E402
from benchmarks.eval_all import CACHE, DATA  # noqa: E402
from benchmarks.external import DEPTH, RETRIEVERS, load_all  # noqa: E402
from benchmarks.external_transfer import (  # noqa: E402
    Fits,
    as_domain,
    ladder,
    references,
    served_choice,
)
from benchmarks.transfer import SETS  # noqa: E402
from calibration import fit_prior  # noqa: E402
from calibration.external import favour_input_order  # noqa: E402
from calibration.profile import prior_profile, single_threaded_blas  # noqa: E402
from calibration.selection import NormLift  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--cache", type=Path, default=CACHE)
    parser.add_argument("--features", nargs="+", help="skip the ladder: use these")
    parser.add_argument(
        "--mpnet",
        choices=("embed", "cached"),
        default="embed",
        help="cached: the mpnet and RRF lists of the sets already embedded only",
    )
    args = parser.parse_args()
    settings = Settings()
    lists = load_all(list(SETS), args.data, args.cache, mpnet=args.mpnet)
    query_ref, doc_ref = references(lists)
    domains = {cell: as_domain(d, query_ref, doc_ref) for cell, d in lists.items()}
    with single_threaded_blas():
        chosen: dict[str, Any] = {}
        if args.features:
            features = tuple(args.features)
        else:
            chosen = ladder(domains)
            features = tuple(chosen["features"])
        fits = Fits(domains, features)
        choice = served_choice(fits)
        prior = favour_input_order(
            fit_prior(
                {f"{s}/{r}": (d.X, d.y) for (s, r), d in domains.items()},
                features=features,
                width=choice["width"],
                point_offset=choice["offset"],
            ),
            choice["order_weight"],
        )
    retrievers = {r for _, r in domains}
    y = np.concatenate([d.y for d in domains.values()])
    offsets = np.cumsum([0] + [int(d.groups.max()) + 1 for d in domains.values()])
    groups = np.concatenate(  # one list one group (the confidence's unit)
        [d.groups + o for d, o in zip(domains.values(), offsets, strict=False)]
    )
    held = np.concatenate(
        [
            dataclasses.replace(
                favour_input_order(
                    fits.without(frozenset({s}), frozenset({r})),
                    choice["order_weight"],
                ),
                point_offset=choice["offset"],
            ).predict_proba(d.X)
            for (s, r), d in domains.items()
        ]
    )
    nll = float(-np.mean(y * np.log(held) + (1 - y) * np.log1p(-held)))
    brier = float(np.mean((held - y) ** 2))
    profile = prior_profile(
        prior,
        query_ref=query_ref,
        doc_ref=doc_ref,
        model=settings.model_name,
        model_id=model_identity(settings.model_path),
        held_out=(y, held, groups),
        norm_lift=NormLift(
            base_method="prior",
            nll_with=nll,
            nll_without=nll,
            brier_with=brier,
            brier_without=brier,
            norm_signal="ell_q" in features,
            reason="the residual query norm was "
            + ("kept" if "ell_q" in features else "not kept")
            + " by the ladder (benchmarks/external_transfer.py)",
        ),
        profile_id=f"default-external-{external_profile_path(settings.model_name).stem}",
        extra_report={
            "source": f"cross-domain prior over {len(domains)} (set, retriever) "
            f"domains: the sets {', '.join(SETS)} (test qrels) under the simulated "
            f"retrievers {', '.join(r for r in RETRIEVERS if r in retrievers)} "
            f"(lists of {DEPTH}; a set without cached mpnet vectors has no mpnet or "
            "rrf lists, see domains; "
            "benchmarks/external.py)",
            "domains": sorted("/".join(cell) for cell in domains),
            "ladder": chosen or None,
            "day_one": {
                "order_weight": choice["order_weight"],
                "order_weight_need": choice["order"]["need"],
                "point_offset": choice["offset"],
                "width": choice["width"],
                "brier_vs_constant": choice["ratio"],
                "width_need": choice["need"],
                "how": "every (set, retriever) held out twice (a prior fitted "
                "without its set and without its retriever): the weight of the "
                "input order is the smallest at which every held-out domain's "
                "returned nDCG@10 is at least its input order's minus 0.01; the "
                "served level "
                "minimises the mean held-out Brier score over that of a constant at "
                "each domain's base rate; the width is the smallest at which every "
                "held-out domain's interval coverage reaches 80%",
            },
            "script": "scripts/fit_rerank_profile.py",
        },
    )
    out = external_profile_path(settings.model_name)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(profile.to_json(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {out.relative_to(REPO)}: prior over {len(domains)} domains")
    print(f"  features: {', '.join(features)}")
    print(
        f"  input order weight {choice['order_weight']:.2f}, served level offset "
        f"{choice['offset']:+.3f}, width x{choice['width']:.2f}"
    )
    print(f"  held out twice: nll {nll:.4f} brier {brier:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
