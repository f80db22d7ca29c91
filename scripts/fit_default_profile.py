"""Fit the shipped default calibration profiles: cross-domain priors.

**The default model's profile** (``app/profiles/<model>.json``) is
:func:`calibration.fit_prior` over the fourteen relevance sets of ``../shared/data``
(``benchmarks.transfer.SETS``; test qrels, each set weighted equally) on the **hybrid
pool of 20** per query: the exact cosine top-20 and the BM25 top-20, every hit with its
lexical evidence. Two evidence groups must earn their place by the one-SE rule on
leave-one-dataset-out predictions (paired per-query NLL): first the residual query norm
(``ell_q``) over the list features, then the lexical columns over what was kept.

**The model-agnostic profile** (``app/profiles/_agnostic.json``, ``--agnostic``) is
the prior over :data:`calibration.prior.AGNOSTIC_FEATURES` (evidence that means the
same for any model) with every (model, set) pair a domain, fitted on the default
model and the models named by ``--models`` (``benchmarks.models``); every held-out
figure leaves the whole dataset out, under every model.

For both, :func:`calibration.prior.lodo_calibrate` chooses the served level and the
interval width leave-one-dataset-out; the report holds the held-out figures and the
coherent confidence's weight fitted on them. No abstain threshold is certified.

Corpus embeddings and the dense/BM25 lists are cached under ``~/.cache/normcal/corpus``
(the cache ``benchmarks/eval_all.py`` uses); missing sets are embedded.

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python scripts/fit_default_profile.py [--agnostic
--models paraphrase-MiniLM-L3-v2 all-mpnet-base-v2]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from app.api.lifespan import load_embedder  # noqa: E402
from app.cli.beir import corpus_is_cached  # noqa: E402
from app.embedding.identity import model_identity  # noqa: E402
from app.profiles import AGNOSTIC_MODEL, AGNOSTIC_PROFILE, default_profile_path  # noqa: E402
from app.settings import Settings  # noqa: E402
from benchmarks.eval_all import CACHE, DATA  # noqa: E402
from benchmarks.transfer import SETS, Domain, K, hybrid_domains  # noqa: E402
from calibration import (  # noqa: E402
    NormReference,
    fit_prior,
    negative_log_likelihood,
    norm_lift_verdict,
)
from calibration.features import LEXICAL_FEATURES  # noqa: E402
from calibration.prior import (  # noqa: E402
    AGNOSTIC_FEATURES,
    PRIOR_FEATURES,
    CrossDomainPrior,
    LodoChoice,
    lodo_calibrate,
)
from calibration.profile import Profile, prior_profile, single_threaded_blas  # noqa: E402
from calibration.selection import NormLift  # noqa: E402


@dataclass(frozen=True)
class Labelled:
    """The training domains: one per (model, set), and the dataset each one is."""

    domains: dict[str, Domain]
    dataset_of: dict[str, str]
    corpora: list[Any]

    @property
    def sets(self) -> dict[str, tuple[Any, Any]]:
        return {k: (d.X, d.y) for k, d in self.domains.items()}

    def pooled(self) -> tuple[np.ndarray, np.ndarray]:
        """Labels and query groups of every domain, in domain order."""
        y = np.concatenate([d.y for d in self.domains.values()])
        offsets = np.cumsum([0] + [len(d.evidence) for d in self.domains.values()])
        groups = np.concatenate(
            [d.groups + o for d, o in zip(self.domains.values(), offsets, strict=False)]
        )
        return y, groups

    def lodo(self, features: tuple[str, ...], point_offset: float = 0.0) -> np.ndarray:
        """Held-out probabilities of every domain from a prior fitted without its set."""
        out = []
        for key, d in self.domains.items():
            others = {
                k: xy
                for k, xy in self.sets.items()
                if self.dataset_of[k] != self.dataset_of[key]
            }
            prior = fit_prior(others, features=features, point_offset=point_offset)
            out.append(prior.predict_proba(d.X))
        return np.concatenate(out)

    def references(self) -> tuple[NormReference, NormReference]:
        """Query and document norm references over every domain's evidence."""
        evidence = [e for d in self.domains.values() for e in d.evidence]
        query_ref = NormReference().fit(
            np.array([e.norm for e in evidence]),
            np.array([e.n_tokens for e in evidence]),
        )
        doc_ref = NormReference().fit(
            np.concatenate([c.norms for c in self.corpora]),
            np.concatenate([c.n_tokens for c in self.corpora]),
        )
        return query_ref, doc_ref


def labelled(
    embedders: list[Any], data: Path, cache: Path, *, cached_only: bool = False
) -> Labelled:
    """Every set under every model (keys ``model/set`` when there are several).

    ``cached_only``: the models after the first take only the sets already embedded
    under them (all-mpnet-base-v2 is slow on a CPU).
    """
    domains, dataset_of, corpora = {}, {}, []
    for i, embedder in enumerate(embedders):
        names = [
            n
            for n in SETS
            if i == 0 or not cached_only or corpus_is_cached(embedder, data / n, cache)
        ]
        for name, (d, corpus) in hybrid_domains(embedder, names, data, cache).items():
            key = name if len(embedders) == 1 else f"{embedder.model_name}/{name}"
            domains[key], dataset_of[key] = d, name
            corpora.append(corpus)
    return Labelled(domains, dataset_of, corpora)


def calibrated_prior(
    data: Labelled, features: tuple[str, ...]
) -> tuple[CrossDomainPrior, LodoChoice]:
    choice = lodo_calibrate(data.sets, features=features, dataset_of=data.dataset_of)
    prior = fit_prior(
        data.sets,
        features=features,
        width=choice.width,
        point_offset=choice.point_offset,
    )
    return prior, choice


def day_one(prior: CrossDomainPrior, choice: LodoChoice) -> dict[str, Any]:
    return {
        "level_df": prior.level_df,
        "point_offset": choice.point_offset,
        "brier_vs_constant": choice.brier_ratio,
        "width": choice.width,
        "width_need": choice.need,
        "how": "leave-one-dataset-out: the served level minimises the mean held-out "
        "Brier score over that of a constant at each set's base rate; the width is "
        "the smallest half-width multiplier at which every held-out set's interval "
        f"coverage reaches {prior.coverage:.0%}",
    }


def model_profile(data: Labelled) -> tuple[Profile, list[str]]:
    """The default model's own profile, its features chosen by the evidence ladder."""
    y, groups = data.pooled()
    with_norm = (*PRIOR_FEATURES, "ell_q")
    p_free, p_norm = data.lodo(PRIOR_FEATURES), data.lodo(with_norm)
    verdict = norm_lift_verdict(y, p_norm, p_free, groups)
    base = with_norm if verdict.kept else PRIOR_FEATURES
    p_base = p_norm if verdict.kept else p_free
    with_lexical = (*base, *LEXICAL_FEATURES)
    p_lex = data.lodo(with_lexical)
    lexical = norm_lift_verdict(y, p_lex, p_base, groups)
    features = with_lexical if lexical.kept else base
    prior, choice = calibrated_prior(data, features)
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
    settings = Settings()
    query_ref, doc_ref = data.references()
    profile = prior_profile(
        prior,
        query_ref=query_ref,
        doc_ref=doc_ref,
        model=settings.model_name,
        model_id=model_identity(settings.model_path),  # applies to these files only
        held_out=(y, data.lodo(features, choice.point_offset), groups),
        norm_lift=lift,
        profile_id=f"default-{default_profile_path(settings.model_name).stem}",
        extra_report={
            "source": f"cross-domain prior over {', '.join(SETS)} (test qrels, "
            f"hybrid pool of {K}: dense top-{K} + BM25 top-{K})",
            "lexical_lift": {
                "features": list(LEXICAL_FEATURES),
                "kept": lexical.kept,
                "verdict": lexical.verdict,
                "nll_with": lexical.nll_with,
                "nll_without": lexical.nll_without,
                "brier_with": float(np.mean((p_lex - y) ** 2)),
                "brier_without": float(np.mean((p_base - y) ** 2)),
                "how": "leave-one-dataset-out, one SE of the paired per-query NLL "
                "difference, over the features kept before it",
            },
            "day_one": day_one(prior, choice),
            "script": "scripts/fit_default_profile.py",
        },
    )
    return profile, [
        f"norm: {verdict.verdict}; lexical: {lexical.verdict}",
        *_summary(prior, choice),
    ]


def agnostic_profile(data: Labelled, models: list[str]) -> tuple[Profile, list[str]]:
    """The model-agnostic profile over every (model, set) domain."""
    y, groups = data.pooled()
    prior, choice = calibrated_prior(data, AGNOSTIC_FEATURES)
    held = data.lodo(AGNOSTIC_FEATURES, choice.point_offset)
    nll = negative_log_likelihood(y, held)
    brier = float(np.mean((held - y) ** 2))
    query_ref, doc_ref = data.references()
    profile = prior_profile(
        prior,
        query_ref=query_ref,
        doc_ref=doc_ref,
        model=AGNOSTIC_MODEL,
        model_id=None,
        held_out=(y, held, groups),
        norm_lift=NormLift(
            base_method="prior",
            nll_with=nll,
            nll_without=nll,
            brier_with=brier,
            brier_without=brier,
            norm_signal=False,
            reason="not measured: a norm means something else under every model, "
            "so the model-agnostic prior has no norm terms",
        ),
        profile_id="default-model-agnostic",
        extra_report={
            "source": f"cross-domain prior over the shared relevance sets under the "
            f"models {', '.join(models)} (test qrels, hybrid pool of {K}; the sets "
            "under each model in 'domains'); every (model, set) pair a domain, each "
            "held out with its set under every model",
            "models": models,
            "domains": list(data.domains),
            "day_one": day_one(prior, choice),
            "script": "scripts/fit_default_profile.py --agnostic",
        },
    )
    return profile, _summary(prior, choice)


def _summary(prior: CrossDomainPrior, choice: LodoChoice) -> list[str]:
    return [
        f"features: {', '.join(prior.features)}",
        f"levels t({prior.level_df:g}), served at location {choice.point_offset:+.3f}"
        f", interval width x{choice.width:.2f}; per set (Brier / constant at its "
        "base rate, width needed):",
        *(
            f"  {name}: {choice.brier_ratio[name]:.2f}, {w:.2f}"
            for name, w in choice.need.items()
        ),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--cache", type=Path, default=CACHE)
    parser.add_argument(
        "--agnostic", action="store_true", help="fit the model-agnostic profile"
    )
    parser.add_argument(
        "--models", nargs="*", default=[], help="other models (benchmarks.models)"
    )
    parser.add_argument(
        "--cached-only",
        action="store_true",
        help="--models: only the sets already embedded under each",
    )
    args = parser.parse_args()
    embedders = [load_embedder(Settings())]
    if args.models:
        from benchmarks.models import load_model

        embedders += [load_model(name) for name in args.models]
    with single_threaded_blas():
        data = labelled(embedders, args.data, args.cache, cached_only=args.cached_only)
        if args.agnostic:
            models = [e.model_name for e in embedders]
            profile, lines = agnostic_profile(data, models)
            out = AGNOSTIC_PROFILE
        else:
            profile, lines = model_profile(data)
            out = default_profile_path(Settings().model_name)
    out.write_text(json.dumps(profile.to_json(), indent=1, sort_keys=True) + "\n")
    m = profile.report.cv["prior"]
    print(f"wrote {out.relative_to(REPO)}: prior over {len(data.domains)} domains")
    print(
        f"  leave-one-dataset-out nll {m.nll:.4f} brier {m.brier:.4f} ece {m.ece:.4f}"
    )
    print(f"  confidence weight {profile.confidence_weight:.3f}")
    for line in lines:
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
