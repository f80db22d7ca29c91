"""Cached, bounded document-frequency lookups (``app.collections.term_counts``).

Pure logic: the counting callback is a fake that records its calls (Milvus itself is
in tests/collections/test_milvus.py and tests/faults/test_milvus.py).
"""

from __future__ import annotations

import threading

import pytest

from app.collections import term_counts
from app.collections.term_counts import LOOKUPS, TOTAL, TermCounts


class Counter:
    """Counts each term as its length; records every call."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, terms: list[str]) -> dict[str, int]:
        self.calls.append(terms)
        return {t: 100 if t == TOTAL else len(t) for t in terms}


def words(n: int, tag: str = "w") -> list[str]:
    return [f"{tag}{i}" for i in range(n)]


@pytest.mark.parametrize("new", [4, 5])
def test_at_most_per_query_new_terms_are_counted_the_rest_left_out(new: int) -> None:
    count = Counter()
    before = (LOOKUPS.counted, LOOKUPS.past_bound)
    known = TermCounts(count, per_query=4, ttl=60).frequencies([words(new)])
    assert count.calls == [[TOTAL, *words(4)]]  # one call for the whole search
    assert set(known) == {TOTAL, *words(4)}  # the fifth term: absent (rare)
    assert (LOOKUPS.counted - before[0], LOOKUPS.past_bound - before[1]) == (
        4,
        new - 4,
    )


def test_counts_are_cached_and_a_later_search_counts_what_was_left() -> None:
    count = Counter()
    terms = TermCounts(count, per_query=2, ttl=60)
    terms.frequencies([["a", "b", "c"]])
    second = terms.frequencies([["a", "b", "c"]])
    assert count.calls == [[TOTAL, "a", "b"], ["c"]]
    assert second == {TOTAL: 100, "a": 1, "b": 1, "c": 1}
    terms.frequencies([["a", "b", "c"]])
    assert len(count.calls) == 2  # nothing new: no call


def test_the_bound_is_per_query_and_shared_terms_are_counted_once() -> None:
    count = Counter()
    TermCounts(count, per_query=2, ttl=60).frequencies(
        [["a", "b", "c"], ["b", "x", "y", "z"], []]
    )
    assert count.calls == [[TOTAL, "a", "b", "x", "y"]]


def test_a_write_during_a_count_keeps_it_out_of_the_cache() -> None:
    count = Counter()
    terms = TermCounts(count, per_query=8, ttl=60)

    def counting_across_a_write(asked: list[str]) -> dict[str, int]:
        terms.forget()  # this process wrote while the count ran
        return count(asked)

    terms._count = counting_across_a_write
    assert terms.frequencies([["a"]])["a"] == 1  # used by the search that counted
    terms._count = count
    terms.frequencies([["a"]])
    assert count.calls == [[TOTAL, "a"], [TOTAL, "a"]]  # not kept: counted again


def test_counts_expire_after_the_ttl_and_the_cache_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    count = Counter()
    expiring = TermCounts(count, per_query=8, ttl=0)
    expiring.frequencies([["a"]])
    expiring.frequencies([["a"]])
    assert count.calls == [[TOTAL, "a"], [TOTAL, "a"]]
    monkeypatch.setattr(term_counts, "CAPACITY", 3)
    small = TermCounts(Counter(), per_query=8, ttl=60)
    small.frequencies([["a", "b"]])
    small.frequencies([["c", "d"]])  # 3 + 2 > 3: the cache starts again
    assert set(small._known) == {"c", "d"}


def test_no_lock_is_held_while_counting() -> None:
    """A search whose terms are cached is answered while another's count runs."""
    count = Counter()
    terms = TermCounts(count, per_query=8, ttl=60)
    terms.frequencies([["cached"]])
    started, release = threading.Event(), threading.Event()

    def slow(asked: list[str]) -> dict[str, int]:
        started.set()
        assert release.wait(60)
        return count(asked)

    terms._count = slow
    slow_search = threading.Thread(target=terms.frequencies, args=([["new"]],))
    slow_search.start()
    assert started.wait(60)
    answered: list[dict[str, int]] = []
    cached = threading.Thread(
        target=lambda: answered.append(terms.frequencies([["cached"]]))
    )
    cached.start()
    cached.join(60)  # a deadlock detector, not a timing: it returns at once
    release.set()
    assert answered == [{TOTAL: 100, "cached": 6}]
    slow_search.join()
    assert count.calls[-1] == ["new"]
