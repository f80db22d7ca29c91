"""An in-memory copy of a collection's FTS5 postings, scored exactly as FTS5's BM25.

Scoring a query through FTS5 (``lexical.search``) visits every match of every term
inside SQLite and holds the store's connection while it does (~50 ms at 10k
documents). The postings here are read once from the FTS5 index itself (an
``fts5vocab`` table of type ``instance``), so FTS5's own tokenisation (unicode61,
diacritics, Porter) is never re-implemented; new documents and query terms are
tokenised by a private in-memory FTS5 table with the same ``tokenize`` option
(:class:`Tokenizer`). Tokens are read as bytes and decoded by ``lexical.vocab_term``,
so one FTS5 cut in the middle of a character (``lexical.MAX_TOKEN_BYTES``) is a key
like any other. A query is then a few numpy operations on the postings of its
terms, with no SQLite connection at all.

The scores are FTS5's to the last bit or so: the same IDF (``log((N - n + 0.5) /
(n + 0.5))``, set to 1e-6 when not positive), the same per-document sum over the
query's phrases in query order, ``N`` and the average length from the documents in
the index, every query term its own phrase (two terms with one stem count twice, as
in FTS5). A term that FTS5 tokenises into several tokens is a phrase query, which
this index does not answer (:meth:`Postings.rank` returns None).

A search wants only the BM25 top of a query (the pool's depth) and the BM25 of a
few other documents (the dense hits): :meth:`Postings.rank` selects the top with a
partition and sorts only it, and answers the rest by lookup (:class:`Ranking`).

The owner keeps it fresh (``CollectionStore``): its own writes are applied here
after they commit (:meth:`Postings.apply`), anything else makes it rebuild, off the
request path (:class:`LexicalBuilds` runs :class:`PostingsBuild` jobs).
"""

from __future__ import annotations

import math
import sqlite3
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from app.collections import lexical

__all__ = [
    "LexicalBuilds",
    "Postings",
    "PostingsBuild",
    "Ranking",
    "Tokenizer",
    "top_order",
]

K1 = 1.2
B = 0.75
_IDF_FLOOR = 1e-6
_CACHED_TERMS = 65_536
"""Query terms whose tokens are remembered (the cache is cleared when full)."""


@dataclass(frozen=True)
class _Tokens:
    """Token occurrences of a batch of texts, grouped as postings."""

    terms: list[str]
    bounds: NDArray[np.int64]  # term i's rows are bounds[i]:bounds[i + 1]
    docs: NDArray[np.int64]  # the text (or document) of each row, ascending per term
    tf: NDArray[np.int32]  # occurrences of the term in that text
    lengths: NDArray[np.int64]  # tokens per text (index: text)

    def posting(self, i: int) -> tuple[NDArray[np.int64], NDArray[np.int32]]:
        lo, hi = int(self.bounds[i]), int(self.bounds[i + 1])
        return self.docs[lo:hi], self.tf[lo:hi]


def _group(
    terms: list[str], counts: Sequence[int], docs: NDArray[np.int64], n_texts: int
) -> _Tokens:
    """Group ``fts5vocab`` instance rows (term-major, then document) into postings.

    ``counts`` is each term's number of instance rows, in the same term order.
    """
    term_of = np.repeat(np.arange(len(terms)), np.asarray(counts, dtype=np.int64))
    starts = np.ones(docs.size, dtype=bool)
    starts[1:] = (docs[1:] != docs[:-1]) | (term_of[1:] != term_of[:-1])
    first = np.flatnonzero(starts)
    tf = np.diff(np.append(first, docs.size)).astype(np.int32)
    per_term = np.bincount(term_of[first], minlength=len(terms))
    bounds = np.concatenate(([0], np.cumsum(per_term))).astype(np.int64)
    lengths = np.bincount(docs, minlength=n_texts).astype(np.int64)
    return _Tokens(terms, bounds, docs[first], tf, lengths)


class Tokenizer:
    """FTS5's tokenizer with a collection's ``tokenize`` option, on a private database.

    Texts are inserted into an in-memory FTS5 table inside a transaction that is rolled
    back, and their tokens read from an ``fts5vocab`` table over it: the tokens and
    token counts FTS5 itself gives the same texts in the collection's index. The
    database closes with the object (a search may still be using it after its
    postings were replaced).
    """

    def __init__(self, stemmer: lexical.Stemmer) -> None:
        self._conn = sqlite3.connect(
            ":memory:", check_same_thread=False, isolation_level=None
        )
        self._conn.execute(
            f"CREATE VIRTUAL TABLE t USING fts5(text, tokenize='{lexical.tokenizer(stemmer)}')"
        )
        self._conn.execute("CREATE VIRTUAL TABLE v USING fts5vocab(t, 'instance')")
        self._lock = threading.Lock()
        self._terms: dict[str, tuple[str, ...]] = {}

    def _vocab(self, texts: Sequence[str], query: str) -> list[tuple[Any, ...]]:
        """Rows of ``query`` on the vocabulary of ``texts`` (numbered by position)."""
        with self._lock:
            self._conn.execute("BEGIN")
            try:
                self._conn.executemany(
                    "INSERT INTO t(rowid, text) VALUES (?, ?)", enumerate(texts)
                )
                return self._conn.execute(query).fetchall()
            finally:
                self._conn.execute("ROLLBACK")

    def texts(self, texts: Sequence[str]) -> _Tokens:
        """The postings of ``texts`` (documents numbered by position)."""
        rows = self._vocab(texts, f"SELECT {lexical.VOCAB_TERM}, doc FROM v")
        terms: list[str] = []
        counts: list[int] = []
        for raw, _ in rows:
            term = lexical.vocab_term(raw)
            if terms and terms[-1] == term:
                counts[-1] += 1
            else:
                terms.append(term)
                counts.append(1)
        docs = np.fromiter((r[1] for r in rows), dtype=np.int64, count=len(rows))
        return _group(terms, counts, docs, len(texts))

    def terms(self, terms: Sequence[str]) -> list[tuple[str, ...]]:
        """The tokens FTS5 makes of each quoted query term (in order; often one).

        Terms not seen lately are tokenised together, in one transaction.
        """
        known = {t: self._terms.get(t) for t in terms}
        missing = [t for t, tokens in known.items() if tokens is None]
        if missing:
            rows = self._vocab(
                missing, f"SELECT doc, {lexical.VOCAB_TERM} FROM v ORDER BY doc, offset"
            )
            found: list[list[str]] = [[] for _ in missing]
            for doc, raw in rows:
                found[doc].append(lexical.vocab_term(raw))
            with self._lock:
                if len(self._terms) + len(missing) > _CACHED_TERMS:
                    self._terms.clear()
                for term, tokens in zip(missing, found, strict=True):
                    known[term] = self._terms[term] = tuple(tokens)
        return [known[t] or () for t in terms]


_NO_SEQS = np.zeros(0, np.int64)
_NO_TF = np.zeros(0, np.int32)
_NO_HITS = lexical.LexicalHits(_NO_SEQS, np.zeros(0))


@dataclass(frozen=True)
class Ranking:
    """One query's BM25 top (FTS5's order), its IDF mass, and any document's BM25.

    ``bm25_of`` gives the score of each seq among the matches in ``allowed``, 0 for
    any other, as the full list of matches would.
    """

    top: lexical.LexicalHits
    idf_mass: float
    bm25_of: Callable[[Sequence[int]], NDArray[np.float64]]

    @classmethod
    def of_hits(
        cls, hits: lexical.LexicalHits, idf_mass: float, depth: int | None
    ) -> Ranking:
        """The ranking of FTS5's full list of matches (best first)."""
        score = dict(zip(hits.seqs.tolist(), hits.scores.tolist(), strict=True))

        def bm25_of(seqs: Sequence[int]) -> NDArray[np.float64]:
            return np.array([score.get(int(s), 0.0) for s in seqs], dtype=np.float64)

        top = lexical.LexicalHits(hits.seqs[:depth], hits.scores[:depth])
        return cls(top, idf_mass, bm25_of)


def top_order(scores: NDArray[np.float64], n: int | None) -> NDArray[np.intp]:
    """Indices of the ``n`` best ``scores``, best first, ties in index order.

    Exactly ``np.argsort(-scores, kind="stable")[:n]``, but only the selected are
    sorted: the ``n``-th best score is found by a partition, every score above it is
    taken and then the lowest indices among those equal to it.
    """
    if n is None or n >= scores.size:
        return np.argsort(-scores, kind="stable")
    if n <= 0:
        return np.zeros(0, dtype=np.intp)
    cut = np.partition(-scores, n - 1)[n - 1]
    above = np.flatnonzero(-scores < cut)
    tied = np.flatnonzero(-scores == cut)[: n - above.size]
    chosen = np.sort(np.concatenate((above, tied)))
    return chosen[np.argsort(-scores[chosen], kind="stable")]


class Postings:
    """Term → (seqs ascending, term frequencies) of the live documents, and their lengths.

    Deleted documents are masked (``_live``) and compacted away once they are a
    quarter of the postings' documents. Not thread-safe against :meth:`apply`: the
    owner runs writes and searches under its read-write lock.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        tokens: _Tokens,
        seqs: NDArray[np.int64],
    ) -> None:
        self._tokenizer = tokenizer
        self._postings: dict[str, tuple[NDArray[np.int64], NDArray[np.int32]]] = {
            term: tokens.posting(i) for i, term in enumerate(tokens.terms)
        }
        self._length = tokens.lengths.astype(np.float64)  # tokens per seq
        self._live = np.zeros(self._length.size, dtype=bool)
        self._live[seqs] = True
        self._count = int(seqs.size)
        self._tokens = int(self._length[self._live].sum())
        self._dead = 0  # deleted documents still in the postings

    @classmethod
    def build(cls, conn: sqlite3.Connection, stemmer: lexical.Stemmer) -> Postings:
        """Read the collection's FTS5 index, in one read transaction."""
        cls.prepare(conn)
        conn.execute("BEGIN")
        try:
            return cls.read(conn, stemmer)
        finally:
            conn.execute("COMMIT")

    @staticmethod
    def prepare(conn: sqlite3.Connection) -> None:
        """Create the (temporary) ``fts5vocab`` tables :meth:`read` reads."""
        table = lexical.FTS_TABLE
        for kind in ("row", "instance"):
            conn.execute(
                f"CREATE VIRTUAL TABLE IF NOT EXISTS temp.{table}_{kind}"
                f" USING fts5vocab(main, {table}, '{kind}')"
            )

    @classmethod
    def read(cls, conn: sqlite3.Connection, stemmer: lexical.Stemmer) -> Postings:
        """Read the index after :meth:`prepare`, inside the caller's read transaction.

        Three statements: outside one transaction, they could see three states.
        """
        table = lexical.FTS_TABLE
        seqs = np.fromiter(
            (r[0] for r in conn.execute(f"SELECT id FROM {table}_docsize")),
            dtype=np.int64,
        )
        rows = conn.execute(
            f"SELECT {lexical.VOCAB_TERM}, cnt FROM temp.{table}_row"
        ).fetchall()
        docs = np.fromiter(
            (r[0] for r in conn.execute(f"SELECT doc FROM temp.{table}_instance")),
            dtype=np.int64,
        )
        size = int(seqs.max()) + 1 if seqs.size else 0
        terms = [lexical.vocab_term(r[0]) for r in rows]
        tokens = _group(terms, [r[1] for r in rows], docs, size)
        return cls(Tokenizer(stemmer), tokens, seqs)

    @property
    def count(self) -> int:
        """Documents in the index."""
        return self._count

    def nbytes(self) -> int:
        """Bytes held by the arrays (not the Python objects around them)."""
        arrays = sum(s.nbytes + t.nbytes for s, t in self._postings.values())
        return arrays + self._length.nbytes + self._live.nbytes

    # -- writes -----------------------------------------------------------------------
    def tokens_of(self, added: Sequence[tuple[int, str]]) -> _Tokens:
        """The tokens of the ``added`` documents' texts, for :meth:`apply`.

        The part of a write that reads FTS5 (and may fail): the store runs it before
        its transaction commits, so that :meth:`apply` after the commit only appends.
        """
        return self._tokenizer.texts([t for _, t in added])

    def apply(
        self,
        removed: Iterable[int],
        added: Sequence[tuple[int, str]],
        tokens: _Tokens | None = None,
    ) -> None:
        """Drop the ``removed`` seqs, then add the ``added`` (seq, text) documents.

        ``tokens`` are the texts' :meth:`tokens_of` (computed here when None). New
        seqs are above every seq in the index (``AUTOINCREMENT``), so appending
        keeps each posting sorted.
        """
        self._remove(np.fromiter(removed, dtype=np.int64))
        if added:
            self._add(added, self.tokens_of(added) if tokens is None else tokens)

    def _remove(self, seqs: NDArray[np.int64]) -> None:
        seqs = seqs[(seqs < self._live.size)]
        seqs = np.unique(seqs[self._live[seqs]])
        if not seqs.size:
            return
        self._live[seqs] = False
        self._count -= int(seqs.size)
        self._tokens -= int(self._length[seqs].sum())
        self._length[seqs] = 0
        self._dead += int(seqs.size)
        if 4 * self._dead > self._count:
            self._compact()

    def _compact(self) -> None:
        compacted = {}
        for term, (seqs, tf) in self._postings.items():
            keep = self._live[seqs]
            if keep.any():
                compacted[term] = (seqs[keep], tf[keep])
        self._postings = compacted
        self._dead = 0

    def _add(self, added: Sequence[tuple[int, str]], tokens: _Tokens) -> None:
        seqs = np.array([s for s, _ in added], dtype=np.int64)
        size = int(seqs.max()) + 1
        if size > self._live.size:
            grown = max(size, 2 * self._live.size)
            self._live = np.concatenate(
                (self._live, np.zeros(grown - self._live.size, dtype=bool))
            )
            self._length = np.concatenate(
                (self._length, np.zeros(grown - self._length.size))
            )
        self._live[seqs] = True
        self._length[seqs] = tokens.lengths
        self._count += int(seqs.size)
        self._tokens += int(tokens.lengths.sum())
        for i, term in enumerate(tokens.terms):
            docs, tf = tokens.posting(i)
            old_seqs, old_tf = self._postings.get(term, (_NO_SEQS, _NO_TF))
            self._postings[term] = (
                np.concatenate((old_seqs, seqs[docs])),
                np.concatenate((old_tf, tf)),
            )

    # -- reads ------------------------------------------------------------------------
    def _posting(self, token: str) -> tuple[NDArray[np.int64], NDArray[np.int32]]:
        seqs, tf = self._postings.get(token, (_NO_SEQS, _NO_TF))
        if self._dead:
            keep = self._live[seqs]
            seqs, tf = seqs[keep], tf[keep]
        return seqs, tf

    def rank(
        self, text: str, allowed: NDArray[np.int64] | None, depth: int | None
    ) -> Ranking | None:
        """The query's ranking among ``allowed``, its top ``depth`` long.

        The top is ``lexical.search(conn, text, depth, allowed)`` (every match if
        ``depth`` is None), the mass ``lexical.idf_mass``. None when a query term is
        several tokens to FTS5 (a phrase query), which only FTS5 answers.
        """
        terms = lexical.query_terms(text)
        phrases: list[tuple[NDArray[np.int64], NDArray[np.int32]]] = []
        for tokens in self._tokenizer.terms(terms):
            if len(tokens) > 1:
                return None
            # A term with no token is a phrase matching nothing (FTS5 does the same).
            phrases.append(self._posting(tokens[0]) if tokens else (_NO_SEQS, _NO_TF))
        stats = lexical.TermStats(terms, self._count, [s.size for s, _ in phrases])
        mass = stats.idf_mass()
        if not terms or self._count == 0:
            return Ranking.of_hits(_NO_HITS, mass, depth)
        scores = self._score(phrases, allowed)
        matched = np.flatnonzero(scores)  # seq order: FTS5's row order
        order = top_order(scores[matched], depth)
        top = lexical.LexicalHits(
            matched[order].astype(np.int64), scores[matched][order]
        )

        def bm25_of(seqs: Sequence[int]) -> NDArray[np.float64]:
            at = np.asarray(seqs, dtype=np.int64)
            inside = (at >= 0) & (at < scores.size)
            found = np.zeros(at.size)
            found[inside] = scores[at[inside]]
            return found

        return Ranking(top, mass, bm25_of)

    def _score(
        self,
        phrases: list[tuple[NDArray[np.int64], NDArray[np.int32]]],
        allowed: NDArray[np.int64] | None,
    ) -> NDArray[np.float64]:
        """FTS5's ``bm25()`` of every match in ``allowed`` by seq (0: no match).

        Each document's score starts at 0 and adds each phrase's term in query order,
        as ``fts5Bm25Function`` does (a phrase it lacks adds exactly 0).
        """
        total = self._count
        avgdl = float(self._tokens) / float(total)
        scores = np.zeros(self._live.size)
        for seqs, tf in phrases:
            if not seqs.size:
                continue
            idf = math.log((total - seqs.size + 0.5) / (seqs.size + 0.5))
            if idf <= 0.0:
                idf = _IDF_FLOOR
            freq = tf.astype(np.float64)
            dl = self._length[seqs]
            scores[seqs] += idf * (
                (freq * (K1 + 1.0)) / (freq + K1 * (1 - B + B * dl / avgdl))
            )
        if allowed is not None:
            keep = np.zeros(scores.size, dtype=bool)
            keep[allowed[(allowed >= 0) & (allowed < scores.size)]] = True
            scores[~keep] = 0.0
        return scores


class PostingsBuild:
    """One background build of a store's postings (see ``CollectionStore``).

    ``deltas`` collects the store's document writes that commit after the build's
    snapshot was taken (None before), in commit order. ``conn`` is the build's own
    read-only connection while it is open (``_lock`` guards it against a cancel).
    """

    def __init__(self, run: Callable[[PostingsBuild], None]) -> None:
        self.run = run
        self.done = threading.Event()
        self.deltas: list[tuple[list[int], list[tuple[int, str]]]] | None = None
        self.conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    def open(self, uri: str) -> sqlite3.Connection:
        """The build's own connection to ``uri`` (closed by :meth:`close`)."""
        with self._lock:
            self.conn = sqlite3.connect(
                uri, uri=True, check_same_thread=False, isolation_level=None
            )
            return self.conn

    def close(self) -> None:
        """Close the build's connection, if open."""
        with self._lock:
            if self.conn is not None:
                self.conn.close()
                self.conn = None

    def interrupt(self) -> None:
        """Abort the statement the build is running, if any (from another thread)."""
        with self._lock:
            if self.conn is not None:
                self.conn.interrupt()


class LexicalBuilds:
    """Runs postings builds off the request path, at most ``limit`` at once.

    One instance serves every collection of a registry, first come first served. A
    worker thread is started when a build is queued and fewer than ``limit`` run;
    it exits once the queue is empty, so an idle service holds no build thread.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._queue: deque[PostingsBuild] = deque()
        self._workers: list[threading.Thread] = []
        self._lock = threading.Lock()

    def submit(self, build: PostingsBuild) -> None:
        """Queue a build, starting a worker if fewer than ``limit`` run."""
        with self._lock:
            self._queue.append(build)
            if len(self._workers) < self.limit:
                worker = threading.Thread(
                    target=self._work, name="lexical-build", daemon=True
                )
                self._workers.append(worker)
                worker.start()

    def cancel(self, build: PostingsBuild) -> bool:
        """Take a queued build off the queue; False if it already started."""
        with self._lock:
            if build not in self._queue:
                return False
            self._queue.remove(build)
        build.done.set()
        return True

    def _work(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._workers.remove(threading.current_thread())
                    return
                build = self._queue.popleft()
            try:
                build.run(build)
            finally:
                build.done.set()

    def join(self) -> None:
        """Wait for the workers to exit (the caller has cancelled what it owns)."""
        with self._lock:
            workers = list(self._workers)
        for worker in workers:
            worker.join()
