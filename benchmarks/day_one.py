"""Day one, held out: does ``abstain`` help, and does ``confidence`` rank queries? (issue 35)

Usage (from the repo root, with ``../shared/data``, ``NORMCAL_SHARED_DATA`` or ``--data``)::

    python -m benchmarks.day_one --out benchmarks/out/day_one.json

Each relevance set X is a collection nobody has judged. It is served by a default
profile built exactly as ``scripts/fit_default_profile.py`` builds the shipped one,
but **without X** (leave-one-dataset-out, nested): the prior is fitted on the other
sets, its served level and interval width chosen on them (``lodo_calibrate``), its
confidence weight fitted on their own leave-one-out probabilities, and its norm
references on their queries and documents. Then, as search serves it, each query's
pool (dense top-20 and BM25 top-20) is scored and the top ``k`` = 10 dense hits are
returned with the confidence, its interval and the abstain flag
(``Profile.score`` and ``Profile.verdict``):

* X's own judged queries: *answerable* when a relevant document is among the
  returned hits. Reported: the AUROC of the confidence and of the best hit's
  probability alone for "anything relevant returned", and the share of answerable
  queries answered (abstain false: **kept**);
* **off-topic** queries: ``OFF_TOPIC_PER_SET`` queries drawn (seeded) from every set
  of *another* domain group (:data:`GROUPS`: medical, aeronautics, electrical
  engineering, information and computing, news, law, everyday forum), searched
  against X's documents; none can be relevant. Reported: the share abstained.

"before" is the previous rule (confidence the coherent blend at the fitted weight;
abstain when the upper end of its interval is below 0.5), "after" the day-one rule
of ``calibration.profile`` (``Profile.day_one_threshold``). Corpus embeddings and
the dense/BM25 lists are cached under ``~/.cache/normcal/corpus`` (shared with
``benchmarks/eval_all.py``; missing sets are embedded, minutes each on a CPU).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.eval_all import CACHE, DATA
from benchmarks.transfer import FEATURES_SHIPPED, SETS, Domain, K, hybrid_domains
from calibration import NormReference, auroc, fit_prior, negative_log_likelihood
from calibration.prior import coherent_confidence, lodo_calibrate
from calibration.profile import (
    FALLBACK_ABSTAIN_THRESHOLD,
    Profile,
    QueryEvidence,
    prior_profile,
    single_threaded_blas,
)
from calibration.selection import NormLift

RETURNED = 10  # hits a search returns by default (app.services.search.DEFAULT_K)
OFF_TOPIC_PER_SET = 10
GROUPS = {
    "scifact": "medical",
    "med": "medical",
    "cf": "medical",
    "cranfield": "aeronautics",
    "npl": "electrical engineering",
    "cisi": "information and computing",
    "lisa": "information and computing",
    "adi": "information and computing",
    "cacm": "information and computing",
    "csfcube": "information and computing",
    "cosqa": "information and computing",
    "time": "news",
    "aila-statutes": "law",
    "semeval2015-cqa": "everyday forum",
}


@dataclass(frozen=True)
class Returned:
    """One query's returned hits as served: probabilities, intervals, verdict."""

    p: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    answerable: bool
    confidence: float
    abstain: bool


def served(profile: Profile, evidence: Sequence[QueryEvidence]) -> list[Returned]:
    """Each query's top :data:`RETURNED` dense hits as search returns them."""
    out = []
    for e in evidence:
        if not len(e.scores):
            continue
        scored = profile.score(
            e.norm, e.n_tokens, e.scores, e.doc_norms, e.doc_tokens, e.lexical
        )
        assert scored.intervals is not None
        top = np.argsort(-e.scores, kind="stable")[:RETURNED]  # the dense list
        p, (lo, hi) = scored.probabilities[top], scored.intervals
        verdict = profile.verdict(p, (lo[top], hi[top]))
        labels = np.zeros(len(top)) if e.labels is None else e.labels[top]
        out.append(
            Returned(
                p,
                lo[top],
                hi[top],
                bool(labels.max() > 0),
                verdict.confidence,
                verdict.abstain,
            )
        )
    return out


def before(profile: Profile, r: Returned) -> tuple[float, bool]:
    """The previous rule: the coherent blend, abstain when its upper end < 0.5."""
    w = profile.confidence_weight
    upper = coherent_confidence(r.hi, w)
    return coherent_confidence(r.p, w), upper < FALLBACK_ABSTAIN_THRESHOLD


def held_out_profile(
    name: str, domains: dict[str, Domain], corpora: dict[str, Any]
) -> Profile:
    """The default profile as the shipped one is built, on every set but ``name``."""
    others = {n: d for n, d in domains.items() if n != name}
    sets = {n: (d.X, d.y) for n, d in others.items()}
    choice = lodo_calibrate(sets, features=FEATURES_SHIPPED)
    prior = fit_prior(
        sets,
        features=FEATURES_SHIPPED,
        width=choice.width,
        point_offset=choice.point_offset,
    )
    p, groups, offset = [], [], 0
    for z, d in others.items():
        inner = {n: xy for n, xy in sets.items() if n != z}
        fitted = fit_prior(
            inner, features=FEATURES_SHIPPED, point_offset=choice.point_offset
        )
        p.append(fitted.predict_proba(d.X))
        groups.append(d.groups + offset)
        offset += int(d.groups.max()) + 1
    y = np.concatenate([d.y for d in others.values()])
    evidence = [e for d in others.values() for e in d.evidence]
    query_ref = NormReference().fit(
        np.array([e.norm for e in evidence]), np.array([e.n_tokens for e in evidence])
    )
    doc_ref = NormReference().fit(
        np.concatenate([corpora[n].norms for n in others]),
        np.concatenate([corpora[n].n_tokens for n in others]),
    )
    lift = NormLift(
        base_method="prior",
        nll_with=0.0,
        nll_without=0.0,
        brier_with=0.0,
        brier_without=0.0,
        norm_signal=False,
        reason="not measured here",
    )
    return prior_profile(
        prior,
        query_ref=query_ref,
        doc_ref=doc_ref,
        model="held-out",
        held_out=(y, np.concatenate(p), np.concatenate(groups)),
        norm_lift=lift,
        profile_id=f"default-without-{name}",
    )


def off_topic_evidence(
    embedder: Any, name: str, corpus: Any, data: Path, cache: Path, seed: int
) -> list[QueryEvidence]:
    """Queries of every set of another group, searched against ``name``'s documents."""
    from app.cli.beir import hybrid_retrieve
    from app.cli.inputs import read_queries
    from calibration.features import LEXICAL_DEPTH

    rng = np.random.default_rng(seed)
    queries: dict[str, str] = {}
    for source in SETS:
        if GROUPS[source] == GROUPS[name]:
            continue
        texts = read_queries(data / source)
        ids = sorted(texts)
        for i in sorted(rng.choice(len(ids), OFF_TOPIC_PER_SET, replace=False)):
            queries[f"{source}:{ids[i]}"] = texts[ids[i]]
    ids = sorted(queries)
    depth = min(LEXICAL_DEPTH, len(corpus.ids))
    hybrid = hybrid_retrieve(embedder, data / name, corpus, queries, ids, depth, cache)
    return hybrid.evidence(corpus, {}, K)


def figures(
    profile: Profile, own: list[Returned], off: list[Returned]
) -> dict[str, Any]:
    """Before and after, for one held-out set."""
    hit = np.array([r.answerable for r in own], dtype=float)
    top = np.array([r.p.max() for r in own])
    rules = {
        "before": (
            [before(profile, r) for r in own],
            [before(profile, r)[1] for r in off],
        ),
        "after": ([(r.confidence, r.abstain) for r in own], [r.abstain for r in off]),
    }
    out: dict[str, Any] = {
        "queries": len(own),
        "answerable": float(hit.mean()),
        "off_topic_queries": len(off),
        "auroc_top_probability": auroc(hit, top) if 0 < hit.mean() < 1 else None,
        "day_one_threshold": profile.day_one_threshold,
        "confidence_weight": profile.confidence_weight,
    }
    for rule, (verdicts, off_abstain) in rules.items():
        conf = np.array([c for c, _ in verdicts])
        abstain = np.array([a for _, a in verdicts])
        out[rule] = {
            "auroc": auroc(hit, conf) if 0 < hit.mean() < 1 else None,
            "nll": negative_log_likelihood(hit, np.clip(conf, 1e-6, 1 - 1e-6)),
            "answerable_kept": float(1 - abstain[hit > 0].mean()),
            "unanswerable_abstained": (
                float(abstain[hit == 0].mean()) if (hit == 0).any() else None
            ),
            "off_topic_abstained": float(np.mean(off_abstain)),
        }
    return out


def _f(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def table(results: dict[str, dict[str, Any]]) -> str:
    """The markdown table of docs/calibration.md."""
    lines = [
        "| held-out set | queries (answerable) | off-topic | AUROC: confidence before"
        " → after (best hit alone) | off-topic abstained before → after | answerable"
        " kept before → after | unanswerable abstained after | threshold |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        b, a = r["before"], r["after"]
        unanswerable = a["unanswerable_abstained"]
        lines.append(
            f"| {name} | {r['queries']} ({100 * r['answerable']:.0f}%) "
            f"| {r['off_topic_queries']} "
            f"| {_f(b['auroc'])} → {_f(a['auroc'])} ({_f(r['auroc_top_probability'])}) "
            f"| {100 * b['off_topic_abstained']:.0f}% → "
            f"{100 * a['off_topic_abstained']:.0f}% "
            f"| {100 * b['answerable_kept']:.0f}% → {100 * a['answerable_kept']:.1f}% "
            f"| {'-' if unanswerable is None else f'{100 * unanswerable:.0f}%'} "
            f"| {_f(r['day_one_threshold'])} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--cache", type=Path, default=CACHE)
    parser.add_argument("--out", type=Path, help="write the JSON results here")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--held-out",
        nargs="+",
        default=list(SETS),
        help="the sets to hold out (every set still serves as training and off-topic)",
    )
    args = parser.parse_args(argv)
    from app.api.lifespan import load_embedder
    from app.settings import Settings

    embedder = load_embedder(Settings())
    loaded = hybrid_domains(embedder, SETS, args.data, args.cache)
    domains = {n: d for n, (d, _) in loaded.items()}
    corpora = {n: c for n, (_, c) in loaded.items()}
    results: dict[str, dict[str, Any]] = {}
    with single_threaded_blas():
        for name in args.held_out:
            print(f"held out: {name}", file=sys.stderr, flush=True)
            profile = held_out_profile(name, domains, corpora)
            off = off_topic_evidence(
                embedder, name, corpora[name], args.data, args.cache, args.seed
            )
            own = served(profile, domains[name].evidence)
            results[name] = figures(profile, own, served(profile, off))
    print(table(results))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        payload = {"k": K, "returned": RETURNED, "sets": results, "groups": GROUPS}
        args.out.write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
