"""What ``normcal ingest``, ``fit`` and ``eval`` read: the documents a BEIR corpus
leaves out (and says so), and the one default qrels split of ``fit`` and ``eval``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli.inputs import cell_number, column_kinds, default_split, read_documents
from app.cli.main import build_parser
from tests.conftest import shared_dataset


def _splits(root: Path, *names: str) -> Path:
    (root / "qrels").mkdir(parents=True)
    for name in names:
        (root / "qrels" / f"{name}.tsv").write_text("query-id\tcorpus-id\tscore\n")
    return root


@pytest.mark.parametrize(
    ("splits", "exclude", "expected"),
    [
        (("train", "test"), None, "train"),
        (("test",), None, "test"),  # no train: the set's test split
        (("dev", "test"), None, "test"),
        (("train", "test"), "train", "test"),  # eval --fit-split train
        (("dev",), None, "train"),  # neither: the split check names 'dev'
    ],
)
def test_one_default_split_rule(tmp_path, splits, exclude, expected):
    assert default_split(_splits(tmp_path / "set", *splits), exclude) == expected


def test_fit_and_eval_leave_the_split_to_the_rule():
    parser = build_parser()
    for command in (["fit", "d", "--collection", "c"], ["eval", "d"]):
        assert parser.parse_args(command).split is None
    assert parser.parse_args(["fit", "d", "--collection", "c"]).skip_unknown is False


def test_a_beir_corpus_reports_the_empty_rows_it_leaves_out(tmp_path):
    root = tmp_path / "set"
    root.mkdir()
    rows = [
        {"_id": "a", "title": "A title", "text": ""},
        {"_id": "b", "title": " ", "text": "\n"},
        {"_id": "c", "title": "", "text": "body"},
        {"_id": 7, "text": ""},
    ]
    (root / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    skipped: list[str] = []
    docs = read_documents(root, skipped=skipped)
    assert [d["id"] for d in docs] == ["a", "c"]
    assert skipped == ["b", "7"]
    assert [d["id"] for d in read_documents(root)] == ["a", "c"]  # no list: silent


def test_cranfield_has_two_empty_documents_and_no_train_split():
    path = shared_dataset("cranfield")
    skipped: list[str] = []
    assert len(read_documents(path, skipped=skipped)) == 1398
    assert skipped == ["471", "995"]
    assert default_split(path) == "test"


@pytest.mark.parametrize(
    ("cell", "number"),
    [
        ("2001", 2001),
        ("-3", -3),
        ("0", 0),
        ("2.5", 2.5),
        ("-0.0", -0.0),
        ("0.1", 0.1),
        (str(2**63 - 1), 2**63 - 1),
        (str(-(2**63)), -(2**63)),
        # text: JSON would write another number, or none
        ("007", None),
        ("02134", None),
        ("-0", None),
        ("+5", None),
        ("2.50", None),
        ("1e3", None),
        (".5", None),
        ("5.", None),
        (" 42", None),
        ("1_000", None),
        ("NaN", None),
        ("nan", None),
        ("Infinity", None),
        ("-inf", None),
        (str(2**63), None),
        (str(-(2**63) - 1), None),
        ("0x10", None),
        ("", None),
    ],
)
def test_a_cell_is_a_number_only_if_json_writes_it_back_the_same(cell, number):
    found = cell_number(cell)
    assert found == number and type(found) is type(number)


def test_a_column_is_typed_as_a_whole():
    rows = [
        (2, {"n": "1", "b": "TRUE", "mixed": "1", "empty": "", "t": "x"}),
        (3, {"n": "2.5", "b": "false", "mixed": "n/a", "empty": "", "t": "1"}),
        (4, {"n": "", "b": "", "mixed": "3", "empty": "", "t": "y"}),
    ]
    kinds = {
        k.column: (k.kind, k.held_by)
        for k in column_kinds(["n", "b", "mixed", "empty", "t"], rows)
    }
    assert kinds == {
        "n": ("number", None),
        "b": ("boolean", None),
        "mixed": ("text", (3, "n/a")),
        "empty": ("text", None),
        "t": ("text", (2, "x")),
    }
    forced = column_kinds(["n"], rows, text_columns={"n"})[0]
    assert (forced.kind, forced.forced) == ("text", True)


def test_csv_typing_looks_at_the_whole_file_even_with_a_limit(tmp_path):
    """A resumed ingest (--limit, then more) stores one column the same way."""
    table = tmp_path / "t.csv"
    table.write_text("id,text,code\n1,a,10\n2,b,11\n3,c,A12\n")
    docs = read_documents(table, limit=2)
    assert [d["metadata"] for d in docs] == [{"code": "10"}, {"code": "11"}]
