"""What ``normcal ingest``, ``fit`` and ``eval`` read, checked before anything is sent.

Documents come from a BEIR folder (``corpus.jsonl``), a plain JSONL file (one
``{"id", "text", "metadata"}`` object a line, the shape the service stores), or a
CSV file (``id`` and ``text`` columns; every other non-empty cell is a string
metadata field). The whole file is read and checked first, so a bad line 17 fails
the command before a single document is written. Every problem is an
:class:`InputError` naming the file (and line): the CLI prints it as one line.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

# app.cli.beir is imported where it is used: it pulls in the calibration package
# (scikit-learn, scipy), seconds that a mistyped path should not wait for.

__all__ = [
    "InputError",
    "check_beir_split",
    "default_split",
    "read_documents",
    "read_judged",
]

FORMATS = "a BEIR folder (corpus.jsonl), a .jsonl file or a .csv file"


class InputError(Exception):
    """A file or folder the user named is missing or not in the expected shape."""


def read_documents(
    path: Path, limit: int | None = None, skipped: list[str] | None = None
) -> list[dict[str, Any]]:
    """The documents in ``path`` (see the module docstring), at most ``limit``.

    A BEIR corpus row with an empty title and text is left out (there is nothing
    to embed), its id appended to ``skipped`` when given; in a JSONL or CSV file
    an empty text is an :class:`InputError`.
    """
    if path.is_dir():
        from app.cli.beir import read_corpus

        corpus = path / "corpus.jsonl"
        if not corpus.is_file():
            raise InputError(
                f"{path}: no corpus.jsonl in this folder; expected {FORMATS}"
            )
        try:
            return list(read_corpus(path, limit, skipped))
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise InputError(f"{corpus}: not a BEIR corpus ({error!r})") from None
    if not path.exists():
        raise InputError(f"{path}: no such file or folder")
    suffix = path.suffix.lower()
    if suffix in {".jsonl", ".ndjson"}:
        rows: Iterable[tuple[int, dict[str, Any]]] = _jsonl_rows(path)
    elif suffix == ".csv":
        rows = _csv_rows(path)
    else:
        raise InputError(f"{path}: unknown format; expected {FORMATS}")
    docs: list[dict[str, Any]] = []
    try:
        for line, row in rows:
            if limit is not None and len(docs) >= limit:
                break
            docs.append(_document(path, line, row))
    except UnicodeDecodeError as error:
        raise InputError(f"{path}: not UTF-8 text ({error.reason})") from None
    except csv.Error as error:
        raise InputError(f"{path}: not CSV ({error})") from None
    return docs


def _jsonl_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with path.open(encoding="utf-8") as fh:
        for line, text in enumerate(fh, start=1):
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except ValueError as error:
                raise InputError(f"{path}:{line}: not JSON ({error})") from None
            if not isinstance(row, dict):
                raise InputError(f"{path}:{line}: expected a JSON object")
            yield line, row


def _csv_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    # utf-8-sig: a spreadsheet's export starts with a byte-order mark.
    with path.open(encoding="utf-8-sig", newline="") as fh:
        reader = csv.DictReader(fh)
        columns = reader.fieldnames or []
        if not {"id", "text"} <= set(columns):
            raise InputError(
                f"{path}: the header must name an 'id' and a 'text' column "
                f"(got {', '.join(columns) or 'no header'})"
            )
        for row in reader:
            if None in row:  # more cells than the header has columns
                raise InputError(f"{path}:{reader.line_num}: more cells than columns")
            metadata = {
                key: value
                for key, value in row.items()
                if key not in {"id", "text"} and value
            }
            yield (
                reader.line_num,
                {"id": row["id"], "text": row["text"], "metadata": metadata},
            )


def _document(path: Path, line: int, row: dict[str, Any]) -> dict[str, Any]:
    """``row`` as a document, or an :class:`InputError` saying what is wrong."""
    doc_id, text, metadata = row.get("id"), row.get("text"), row.get("metadata")
    if isinstance(doc_id, int) and not isinstance(doc_id, bool):
        doc_id = str(doc_id)
    if not isinstance(doc_id, str) or not doc_id:
        raise InputError(f"{path}:{line}: needs an 'id' (a non-empty string)")
    if not isinstance(text, str) or not text.strip():
        raise InputError(f"{path}:{line}: document {doc_id!r} needs a non-empty 'text'")
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise InputError(f"{path}:{line}: 'metadata' of {doc_id!r} must be an object")
    return {"id": doc_id, "text": text, "metadata": metadata}


def check_beir_split(data_dir: Path, *splits: str, corpus: bool = False) -> None:
    """Fail with one line unless ``data_dir`` holds queries and each qrels split.

    Checked before a model loads or a request is sent; a wrong ``--split`` gets
    the splits that do exist.
    """
    if not data_dir.is_dir():
        raise InputError(f"{data_dir}: no such folder (expected a BEIR folder)")
    needed = ["queries.jsonl", *(["corpus.jsonl"] if corpus else [])]
    for name in needed:
        if not (data_dir / name).is_file():
            raise InputError(f"{data_dir}: no {name} (not a BEIR folder)")
    qrels = data_dir / "qrels"
    available = sorted(p.stem for p in qrels.glob("*.tsv"))
    for split in splits:
        if split not in available:
            raise InputError(
                f"{data_dir}: no qrels split {split!r} "
                f"(available: {', '.join(available) or f'none, {qrels} is empty'})"
            )


# The qrels split ``fit`` and ``eval`` use when none is named, in order of preference.
DEFAULT_SPLITS = ("train", "test")


def default_split(data_dir: Path, exclude: str | None = None) -> str:
    """The qrels split of ``data_dir`` to use when the command names none.

    One rule for ``normcal fit`` and ``normcal eval``: the set's ``train`` split,
    or its ``test`` split when there is no train (``exclude``, eval's
    ``--fit-split``, is never chosen). With neither, ``train``: the check of the
    split then names those that exist.
    """
    available = {p.stem for p in (data_dir / "qrels").glob("*.tsv")}
    for split in DEFAULT_SPLITS:
        if split in available and split != exclude:
            return split
    return DEFAULT_SPLITS[0]


def read_judged(
    data_dir: Path, split: str
) -> tuple[dict[str, str], dict[str, dict[str, int]]]:
    """Queries (id -> text) and one split's qrels of a BEIR folder, checked."""
    from app.cli.beir import read_qrels, read_queries

    check_beir_split(data_dir, split)
    try:
        return read_queries(data_dir), read_qrels(data_dir, split)
    except (ValueError, KeyError, TypeError) as error:
        raise InputError(
            f"{data_dir}: unreadable queries.jsonl or qrels/{split}.tsv ({error!r})"
        ) from None
