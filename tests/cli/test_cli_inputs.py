"""What ``normcal ingest``, ``fit`` and ``eval`` read: the documents a BEIR corpus
leaves out (and says so), and the one default qrels split of ``fit`` and ``eval``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli.inputs import default_split, read_documents
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
