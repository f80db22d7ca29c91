"""Suggested queries for a collection nobody has searched yet (the judging page's start).

A suggestion is a keyword query made of one document's most distinctive words: the
three with the highest ``tf * idf`` in that document, where the document frequency
is counted over a sample of the collection (:data:`SAMPLE_WINDOWS` windows of
:data:`WINDOW` documents spread over it). A word counts when it has at least three
letters, is not an English stop word and, in a sample of
:data:`MIN_SAMPLE_FOR_DF` documents or more, occurs in at least two of them (a word
of one document only is mostly a name or a typo, and a query should be able to match
more than the document it came from). The words keep their order in the document.
The source documents are spread over the sample, so the suggestions cover the
collection rather than its first pages. Everything is deterministic: the same
collection gives the same suggestions.

They are a way to start, not a substitute for real queries: a calibrator learns the
level of relevance of the queries it is judged on, so the page asks for queries users
actually ask first, and says where these come from.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

MAX_SUGGESTIONS = 20  # the most one request may ask for
WORDS_PER_QUERY = 3
SAMPLE_WINDOWS = 10
WINDOW = 100  # documents read per window: a sample of at most 1,000
MIN_SAMPLE_FOR_DF = 20  # below this, a word of one document counts too
_WORD = re.compile(r"[^\W\d_]{3,}")


@dataclass(frozen=True)
class Suggestion:
    """A suggested query and the document its words came from."""

    query: str
    document_id: str


def _words(text: str) -> list[str]:
    return [w for w in _WORD.findall(text.lower()) if w not in ENGLISH_STOP_WORDS]


def suggest(
    documents: Sequence[tuple[str, str]], n: int, exclude: Iterable[str] = ()
) -> list[Suggestion]:
    """Up to ``n`` keyword queries from ``documents`` (``(id, text)``, in order).

    ``exclude`` holds queries not to suggest again (queued, judged or skipped ones).
    """
    if n < 1 or not documents:
        return []
    tokens = [_words(text) for _, text in documents]
    df = Counter(w for words in tokens for w in set(words))
    min_df = 2 if len(documents) >= MIN_SAMPLE_FOR_DF else 1
    seen = set(exclude)
    out: list[Suggestion] = []
    # Sources spread over the sample: every step-th document, then the ones between.
    step = max(1, len(documents) // n)
    order = [i for start in range(step) for i in range(start, len(documents), step)]
    for i in order:
        counts = Counter(tokens[i])
        weight = {
            w: tf * math.log((1 + len(documents)) / df[w])
            for w, tf in counts.items()
            if df[w] >= min_df
        }
        best = sorted(weight, key=lambda w: (-weight[w], w))[:WORDS_PER_QUERY]
        if len(best) < 2:
            continue
        first = {w: tokens[i].index(w) for w in best}
        query = " ".join(sorted(best, key=first.__getitem__))
        if query in seen:
            continue
        seen.add(query)
        out.append(Suggestion(query, documents[i][0]))
        if len(out) == n:
            break
    return out
