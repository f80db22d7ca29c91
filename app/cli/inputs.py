"""What ``normcal ingest``, ``fit`` and ``eval`` read, checked before anything is sent.

Documents come from a BEIR folder (``corpus.jsonl``), a plain JSONL file (one
``{"id", "text", "metadata"}`` object a line, the shape the service stores), or a
CSV file (``id`` and ``text`` columns; every other non-empty cell is a metadata
field, typed column by column: :func:`column_kinds`). The whole file is read and
checked first, so a bad line 17 fails the command before a single document is
written. Every problem is an :class:`InputError` naming the file (and line): the
CLI prints it as one line.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

# The BEIR readers live here, not in app.cli.beir: that module pulls in the
# calibration package (scikit-learn, scipy), ~2.3 s that neither a mistyped path nor
# `normcal ingest` of a BEIR folder should wait for.

__all__ = [
    "ColumnKind",
    "InputError",
    "Qrels",
    "check_beir_split",
    "column_kinds",
    "default_split",
    "read_corpus",
    "read_documents",
    "read_judged",
    "read_qrels",
    "read_queries",
]

FORMATS = "a BEIR folder (corpus.jsonl), a .jsonl file or a .csv file"


Qrels = dict[str, dict[str, int]]


def read_corpus(
    data_dir: Path, limit: int | None = None, skipped: list[str] | None = None
) -> Iterator[dict[str, Any]]:
    """Yield ``{"id", "text", "metadata"}`` from a BEIR ``corpus.jsonl``.

    The title, when present, is the first line of the text (BEIR's convention of
    embedding title and body together). A row whose title and text are both empty
    has nothing to embed and is left out; its id goes to ``skipped`` when given.
    ``limit`` counts rows, left-out ones included.
    """
    with (data_dir / "corpus.jsonl").open(encoding="utf-8") as fh:
        for n, line in enumerate(fh):
            if limit is not None and n >= limit:
                return
            row = json.loads(line)
            title = (row.get("title") or "").strip()
            body = (row.get("text") or "").strip()
            text = f"{title}\n{body}" if title and body else (title or body)
            if text:
                yield {"id": str(row["_id"]), "text": text, "metadata": {}}
            elif skipped is not None:
                skipped.append(str(row["_id"]))


def read_queries(data_dir: Path) -> dict[str, str]:
    """Query id -> text."""
    out: dict[str, str] = {}
    with (data_dir / "queries.jsonl").open(encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            out[str(row["_id"])] = str(row["text"])
    return out


def read_qrels(data_dir: Path, split: str) -> Qrels:
    """Query id -> {document id: graded relevance} (``0`` rows kept as judged)."""
    path = data_dir / "qrels" / f"{split}.tsv"
    out: Qrels = {}
    with path.open(encoding="utf-8") as fh:
        for row in csv.DictReader(fh, delimiter="\t"):
            out.setdefault(str(row["query-id"]), {})[str(row["corpus-id"])] = int(
                row["score"]
            )
    return out


class InputError(Exception):
    """A file or folder the user named is missing or not in the expected shape."""


def read_documents(
    path: Path,
    limit: int | None = None,
    skipped: list[str] | None = None,
    *,
    text_columns: Collection[str] = (),
    kinds: list[ColumnKind] | None = None,
) -> list[dict[str, Any]]:
    """The documents in ``path`` (see the module docstring), at most ``limit``.

    A BEIR corpus row with an empty title and text is left out (there is nothing
    to embed), its id appended to ``skipped`` when given; in a JSONL or CSV file
    an empty text is an :class:`InputError`. A CSV file's metadata columns are
    typed over the whole file (:func:`column_kinds`; ``text_columns`` stay text),
    and their kinds appended to ``kinds`` when given.
    """
    if text_columns and (path.is_dir() or path.suffix.lower() != ".csv"):
        raise InputError(f"{path}: --text-column applies to a .csv file only")
    if path.is_dir():
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
        rows = _csv_rows(path, text_columns, kinds)
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


def _csv_rows(
    path: Path, text_columns: Collection[str], kinds: list[ColumnKind] | None
) -> list[tuple[int, dict[str, Any]]]:
    """Every row of a CSV file, its metadata typed by :func:`column_kinds`."""
    try:
        with path.open(encoding="utf-8-sig", newline="") as fh:
            # utf-8-sig: a spreadsheet's export starts with a byte-order mark.
            reader = csv.DictReader(fh)
            columns = list(reader.fieldnames or [])
            if not {"id", "text"} <= set(columns):
                raise InputError(
                    f"{path}: the header must name an 'id' and a 'text' column "
                    f"(got {', '.join(columns) or 'no header'})"
                )
            rows = []
            for row in reader:
                if None in row:  # more cells than the header has columns
                    raise InputError(
                        f"{path}:{reader.line_num}: more cells than columns"
                    )
                rows.append((reader.line_num, row))
    except UnicodeDecodeError as error:
        raise InputError(f"{path}: not UTF-8 text ({error.reason})") from None
    except csv.Error as error:
        raise InputError(f"{path}: not CSV ({error})") from None
    fields = [c for c in columns if c not in {"id", "text"}]
    unknown = [c for c in text_columns if c not in fields]
    if unknown:
        raise InputError(
            f"{path}: --text-column {unknown[0]!r} is not a metadata column "
            f"(the metadata columns are: {', '.join(fields) or 'none'})"
        )
    found = column_kinds(fields, rows, text_columns)
    if kinds is not None:
        kinds.extend(found)
    typed = {kind.column: kind for kind in found}
    return [
        (
            line,
            {
                "id": row["id"],
                "text": row["text"],
                "metadata": {
                    key: typed[key].value(cell)
                    for key, cell in row.items()
                    if key in typed and cell
                },
            },
        )
        for line, row in rows
    ]


# An integer as JSON writes it: no sign but a minus, no leading zero (``007``, a
# zip code like ``02134``, stays text), no ``-0``.
_INTEGER = re.compile(r"-?(0|[1-9][0-9]*)")
_INT64 = (-(2**63), 2**63 - 1)  # what the service stores exactly (app.schemas.common)
_BOOLEANS = {"true": True, "false": False}


def cell_number(cell: str) -> int | float | None:
    """The JSON number a CSV cell writes exactly, or None (the cell stays text).

    An integer in the signed 64-bit range, or a decimal whose shortest form is
    the cell itself (``2.5``, not ``2.50``, ``1e3`` or ``.5``), so the stored
    number prints as the cell did: nothing is lost or re-spelt. ``NaN`` and
    ``Infinity`` are not JSON numbers.
    """
    if _INTEGER.fullmatch(cell):
        value = int(cell)
        return value if cell != "-0" and _INT64[0] <= value <= _INT64[1] else None
    try:
        number = float(cell)
    except ValueError:
        return None
    return number if math.isfinite(number) and repr(number) == cell else None


@dataclass(frozen=True)
class ColumnKind:
    """How a CSV metadata column is stored, and what kept a numeric one text."""

    column: str
    kind: Literal["number", "boolean", "text"]
    held_by: tuple[int, str] | None = None  # (line, cell) of a column kept text
    forced: bool = False  # named by --text-column

    def value(self, cell: str) -> Any:
        """The JSON value a (non-empty) cell of this column is stored as."""
        if self.kind == "number":
            return cell_number(cell)
        if self.kind == "boolean":
            return _BOOLEANS[cell.lower()]
        return cell


def column_kinds(
    columns: list[str],
    rows: list[tuple[int, dict[str, str]]],
    text_columns: Collection[str] = (),
) -> list[ColumnKind]:
    """The kind of each metadata column, decided over all its non-empty cells.

    ``number`` when every one is a JSON number (:func:`cell_number`), ``boolean``
    when every one is ``true`` or ``false`` (any case: spreadsheets write
    ``TRUE``), else ``text``: a column is one kind, so a single ``n/a`` or
    ``02134`` keeps the whole column text (``held_by`` names the first such cell
    of a column whose other cells are numbers) and a filter sees one type in it.
    An empty cell is no metadata key. ``text_columns`` are text whatever they hold.
    """
    out = []
    for column in columns:
        cells = [(line, row[column]) for line, row in rows if row[column]]
        if column in text_columns:
            out.append(ColumnKind(column, "text", forced=True))
        elif cells and all(c.lower() in _BOOLEANS for _, c in cells):
            out.append(ColumnKind(column, "boolean"))
        else:
            numbers = [cell_number(c) is not None for _, c in cells]
            if cells and all(numbers):
                out.append(ColumnKind(column, "number"))
            else:
                held = None
                if any(numbers):
                    held = next(
                        lc for lc, ok in zip(cells, numbers, strict=True) if not ok
                    )
                out.append(ColumnKind(column, "text", held_by=held))
    return out


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


def read_judged(data_dir: Path, split: str) -> tuple[dict[str, str], Qrels]:
    """Queries (id -> text) and one split's qrels of a BEIR folder, checked."""
    check_beir_split(data_dir, split)
    try:
        return read_queries(data_dir), read_qrels(data_dir, split)
    except (ValueError, KeyError, TypeError) as error:
        raise InputError(
            f"{data_dir}: unreadable queries.jsonl or qrels/{split}.tsv ({error!r})"
        ) from None
