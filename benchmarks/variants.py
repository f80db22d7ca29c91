"""Lexical-heavy variants of the shared relevance sets, derived at run time.

A product catalogue of short titles, or code searched by its identifiers, is where
lexical evidence is far stronger than dense (issue 36: BM25 0.381 against dense 0.278
on a product-search set). None of the shared sets is like that, so this module makes
some: the same queries and qrels over a shortened corpus.

* ``NAME-titles``: each document is its title alone (the sets with titles).
* ``NAME-lead``: each document is its first 12 words (the sets without titles), a
  short-title stand-in.
* ``cosqa-identifiers``: each code document is the identifiers it uses, in order
  (no strings, comments, docstrings or keywords).
* ``cosqa-names``: each code document is its function's name and parameters only.

Variants are written once under ``~/.cache/normcal/variants/`` (``root``), never into
the repository (the data is not ours to copy); each file atomically (a temporary file,
then ``os.replace``), so another process never reads half a corpus. A variant is
rebuilt only when it is missing, so its corpus file keeps its mtime and the corpus
embedding cache of ``normcal eval`` (keyed by size and mtime) stays valid.
"""

from __future__ import annotations

import hashlib
import io
import json
import keyword
import os
import re
import tempfile
import tokenize
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ROOT", "VARIANTS", "derive", "variant_names"]

ROOT = Path.home() / ".cache" / "normcal" / "variants"
LEAD_WORDS = 12

Row = dict[str, Any]


def _titles(row: Row) -> str:
    return str(row.get("title") or "").strip()


def _lead(row: Row) -> str:
    words = str(row.get("text") or "").split()
    return " ".join(words[:LEAD_WORDS])


def _code_tokens(code: str) -> Iterator[tokenize.TokenInfo]:
    try:
        yield from tokenize.generate_tokens(io.StringIO(code).readline)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return


def _identifiers(row: Row) -> str:
    """The names a code document uses, in order of first use (keywords left out)."""
    code = str(row.get("text") or "")
    seen: dict[str, None] = {}
    for tok in _code_tokens(code):
        if tok.type == tokenize.NAME and not keyword.iskeyword(tok.string):
            seen.setdefault(tok.string, None)
    if not seen:  # not Python: fall back to word-like runs outside quotes
        stripped = re.sub(r"(['\"]).*?\1", " ", code)
        for word in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", stripped):
            seen.setdefault(word, None)
    return " ".join(seen)


def _names(row: Row) -> str:
    """A code document's function name and parameter names (its signature)."""
    code = str(row.get("text") or "")
    match = re.search(r"def\s+([A-Za-z_]\w*)\s*\(([^)]*)\)", code)
    if match is None:
        return _identifiers(row).split(" ", 1)[0]
    params = [
        m.group(0)
        for part in match.group(2).split(",")
        if (m := re.match(r"[A-Za-z_]\w*", part.strip().lstrip("*")))
    ]
    return " ".join([match.group(1), *params])


_WORD = re.compile(r"[^\W_]+")


def _key(word: str) -> str:
    """The form a word is ciphered by: lower case, a plural's ``s`` dropped."""
    w = word.lower()
    return w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w


def _code(word: str) -> str:
    """A pseudo-word for ``word``: the same for every occurrence, meaningless to a model."""
    digest = hashlib.blake2b(_key(word).encode(), digest_size=5).digest()
    return "".join(_LETTERS[b % len(_LETTERS)] for b in digest) + "q"


_LETTERS = "bcdfghjklmnpqrstvwxz"


class RareWords:
    """Rewrites the words of at most ``share`` of a corpus's documents as codes.

    A word the embedding model never saw (a brand, a part number, a gene) still
    matches itself in BM25; the model sees only the pieces of an unknown string. The
    same code replaces a word in documents and queries, so every exact match survives.
    """

    def __init__(self, texts: Iterable[str], share: float) -> None:
        df: Counter[str] = Counter()
        n = 0
        for text in texts:
            n += 1
            df.update({_key(w) for w in _WORD.findall(text)})
        self.limit = max(1.0, share * n)
        self.df = df

    def __call__(self, text: str) -> str:
        def swap(m: re.Match[str]) -> str:
            word = m.group(0)
            rare = self.df.get(_key(word), 0) <= self.limit
            return _code(word) if rare or any(c.isdigit() for c in word) else word

        return _WORD.sub(swap, text)


def _whole(row: Row) -> str:
    title, body = _titles(row), str(row.get("text") or "").strip()
    return f"{title}\n{body}" if title and body else title or body


@dataclass(frozen=True)
class Variant:
    """A derived set: its source set, the text each document keeps, and the cipher.

    ``rare_share``: when set, the words of at most that share of the derived
    documents (and any word with a digit) are rewritten as codes in documents and
    queries alike (:class:`RareWords`).
    """

    source: str
    document: Callable[[Row], str]
    rare_share: float | None = None


_TITLED = ("scifact", "cranfield", "cisi", "cacm", "cf", "adi", "lisa", "csfcube")
VARIANTS: dict[str, Variant] = {
    **{f"{name}-titles": Variant(name, _titles) for name in _TITLED},
    **{
        f"{name}-lead": Variant(name, _lead)
        for name in ("npl", "time", "med", "semeval2015-cqa")
    },
    "cosqa-identifiers": Variant("cosqa", _identifiers),
    "cosqa-names": Variant("cosqa", _names),
    **{
        f"{name}-rare": Variant(name, _whole, rare_share=0.01)
        for name in ("scifact", "cacm", "npl", "time", "cosqa")
    },
    **{
        f"{name}-titles-rare": Variant(name, _titles, rare_share=0.01)
        for name in ("scifact", "cacm", "cranfield")
    },
}
"""Every variant, by name."""


def variant_names() -> tuple[str, ...]:
    return tuple(VARIANTS)


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def derive(name: str, data: Path, root: Path = ROOT) -> Path:
    """The BEIR folder of variant ``name`` of the sets under ``data`` (made if missing).

    Documents whose derived text is empty are left out (a relevant one still counts
    in the ideal ranking of nDCG, as a document no retriever can find).
    """
    variant = VARIANTS[name]
    source, out = data / variant.source, root / name
    corpus = out / "corpus.jsonl"
    if corpus.exists():
        return out
    docs = []
    with (source / "corpus.jsonl").open(encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            if text := variant.document(row):
                docs.append((row["_id"], text))
    queries = [json.loads(line) for line in (source / "queries.jsonl").open()]
    if variant.rare_share is not None:
        cipher = RareWords((t for _, t in docs), variant.rare_share)
        docs = [(i, cipher(t)) for i, t in docs]
        queries = [{**q, "text": cipher(str(q["text"]))} for q in queries]
    for split in sorted((source / "qrels").glob("*.tsv")):
        _write_atomic(out / "qrels" / split.name, split.read_text(encoding="utf-8"))
    _write_atomic(
        out / "queries.jsonl",
        "".join(
            json.dumps({"_id": q["_id"], "text": q["text"]}) + "\n" for q in queries
        ),
    )
    _write_atomic(  # last: its presence means the variant is complete
        corpus,
        "".join(json.dumps({"_id": i, "title": "", "text": t}) + "\n" for i, t in docs),
    )
    return out
