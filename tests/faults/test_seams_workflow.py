"""Issue 21, defects 11 and 14: bounded judging state, and the first natural workflow.

Against one real ``normcal serve`` subprocess (real model, SQLite and FAISS) with small
caps set through ``NORMCAL_*`` variables, so each bound is reached in a few requests:

- 11: stored feedback past ``max_judgments_per_collection``, the judging queue past
  ``max_judging_queue`` and a fit whose sent plus stored judgments pass
  ``max_judgments_per_fit`` are 422s naming the limit, and nothing changes (the
  stored count, the queue, the fit jobs, the active calibrator). Each is tried at the
  bound (served) and one past it.
- 14: a BEIR folder with an empty document its qrels name: ``normcal ingest`` says
  it skipped it, ``normcal fit`` refuses as before and ``--skip-unknown`` fits and
  says how many judgments it dropped; a fit job with too few judged queries is a 422
  at ``POST`` and no job.

Each test uses its own collection, so they share the server.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.cli.main import EXIT_API, main
from tests.conftest import assert_problem
from tests.support.corpus import CORPUS, QUERIES
from tests.support.server import ServerProcess

pytestmark = [pytest.mark.slow, pytest.mark.server]

PER_COLLECTION = 12  # NORMCAL_MAX_JUDGMENTS_PER_COLLECTION
QUEUE = 6  # NORMCAL_MAX_JUDGING_QUEUE
PER_FIT = 15  # NORMCAL_MAX_JUDGMENTS_PER_FIT

# Every query judged on every document (1 relevant each), document by document: any
# 5 consecutive judgments cover the 5 queries.
ALL_JUDGMENTS = [
    {"query": q, "document_id": doc, "relevance": int(doc == key)}
    for doc in CORPUS
    for key, q in QUERIES.items()
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("seams-workflow")
    env = {
        "NORMCAL_MAX_JUDGMENTS_PER_COLLECTION": str(PER_COLLECTION),
        "NORMCAL_MAX_JUDGING_QUEUE": str(QUEUE),
        "NORMCAL_MAX_JUDGMENTS_PER_FIT": str(PER_FIT),
    }
    with (tmp / "server.log").open("wb") as log:
        proc = ServerProcess(tmp / "data", env=env, log=log).start()
        try:
            yield proc
        finally:
            proc.stop()


@pytest.fixture
def api(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=120) as client:
        yield client


def _collection(api: httpx.Client, name: str) -> str:
    """A new collection holding the five test documents; returns its path."""
    assert api.post("/v1/collections", json={"name": name}).status_code == 201
    docs = [{"id": key, "text": text} for key, text in CORPUS.items()]
    r = api.put(f"/v1/collections/{name}/documents", json={"documents": docs})
    assert r.status_code == 200, r.text
    return f"/v1/collections/{name}"


def _stored(api: httpx.Client, path: str) -> list[dict[str, Any]]:
    r = api.get(f"{path}/feedback", params={"limit": 1000})
    assert r.status_code == 200, r.text
    return list(r.json()["data"])


def _limit_refusal(response: httpx.Response, limit: str) -> None:
    problem = assert_problem(response, 422)
    assert problem["type"] == "/problems/limit-exceeded", problem
    assert f"limits.{limit}" in problem["detail"], problem


def test_feedback_past_the_collection_cap_is_refused_and_stores_nothing(api):
    path = _collection(api, "feedback_cap")
    first = api.post(f"{path}/feedback", json={"judgments": ALL_JUDGMENTS[:11]})
    assert first.status_code == 201 and first.json()["total"] == 11, first.text
    # 11 + 2 > 12: refused whole, not half stored.
    past = api.post(f"{path}/feedback", json={"judgments": ALL_JUDGMENTS[11:13]})
    _limit_refusal(past, "max_judgments_per_collection")
    assert len(_stored(api, path)) == 11
    at_bound = api.post(f"{path}/feedback", json={"judgments": ALL_JUDGMENTS[11:12]})
    assert at_bound.status_code == 201 and at_bound.json()["total"] == PER_COLLECTION
    one_past = api.post(f"{path}/feedback", json={"judgments": ALL_JUDGMENTS[12:13]})
    _limit_refusal(one_past, "max_judgments_per_collection")
    assert len(_stored(api, path)) == PER_COLLECTION
    # Room again once feedback is deleted.
    assert api.delete(f"{path}/feedback").json() == {"deleted": PER_COLLECTION}
    again = api.post(f"{path}/feedback", json={"judgments": ALL_JUDGMENTS[12:13]})
    assert again.status_code == 201 and again.json()["total"] == 1


def _waiting(api: httpx.Client, path: str) -> int:
    r = api.get(f"{path}/judging/next", params={"k": 1})
    assert r.status_code == 200, r.text
    return int(r.json()["progress"]["remaining"])


def test_the_judging_queue_past_its_cap_is_refused_and_queues_nothing(api):
    path = _collection(api, "queue_cap")
    queries = [f"query number {i}" for i in range(QUEUE + 2)]
    added = api.post(f"{path}/judging/queries", json={"queries": queries[:5]})
    assert added.status_code == 201 and added.json()["added"] == 5, added.text
    past = api.post(f"{path}/judging/queries", json={"queries": queries[5:7]})
    _limit_refusal(past, "max_judging_queue")
    assert _waiting(api, path) == 5
    at_bound = api.post(f"{path}/judging/queries", json={"queries": queries[5:6]})
    assert at_bound.status_code == 201 and at_bound.json()["added"] == 1
    one_past = api.post(f"{path}/judging/queries", json={"queries": queries[6:7]})
    _limit_refusal(one_past, "max_judging_queue")
    assert _waiting(api, path) == QUEUE
    # A skipped query no longer waits: room for one more.
    skipped = api.post(f"{path}/judging/skip", json={"query": queries[0]})
    assert skipped.status_code == 204
    again = api.post(f"{path}/judging/queries", json={"queries": queries[6:7]})
    assert again.status_code == 201 and again.json()["added"] == 1


def _fit_jobs(api: httpx.Client, path: str) -> int:
    return int(api.get(f"{path}/fit-jobs").json()["count"])


def _calibrator(api: httpx.Client, path: str) -> dict[str, Any]:
    return dict(api.get(path).json()["calibrator"])


def test_a_fit_past_max_judgments_per_fit_with_stored_feedback_is_refused(api):
    path = _collection(api, "fit_total")
    stored = ALL_JUDGMENTS[:PER_COLLECTION]
    assert api.post(f"{path}/feedback", json={"judgments": stored}).status_code == 201
    before = _calibrator(api, path)
    body = {"method": "platt", "k": 5, "abstain_target": None}
    extra = ALL_JUDGMENTS[PER_COLLECTION:]
    # 4 sent + 12 stored = 16 > 15: refused, as a fit and as a fit job.
    over = {**body, "judgments": extra[: PER_FIT - PER_COLLECTION + 1]}
    for route in ("calibrators", "fit-jobs"):
        refused = api.post(f"{path}/{route}", json=over)
        _limit_refusal(refused, "max_judgments_per_fit")
        assert "12 stored" in refused.json()["detail"]
    assert _fit_jobs(api, path) == 0
    assert _calibrator(api, path) == before
    assert len(api.get(f"{path}/calibrators").json()["data"]) <= 1  # the default
    # Without the stored feedback the same judgments are within the limit ...
    alone = api.post(f"{path}/calibrators", json={**over, "include_feedback": False})
    assert alone.status_code == 422  # (4 judgments of 1 query: too few to fit)
    assert alone.json()["type"] == "/problems/insufficient-data"
    # ... and 3 sent + 12 stored = 15, at the bound, fits.
    fitted = api.post(
        f"{path}/calibrators", json={**body, "judgments": extra[: PER_FIT - 12]}
    )
    assert fitted.status_code == 201, fitted.text
    assert fitted.json()["report"]["n_pairs"] == 25  # 5 queries x k=5
    assert _calibrator(api, path)["id"] == fitted.json()["id"]


def _beir(root: Path) -> Path:
    """A BEIR folder: the five documents plus an empty one, which the qrels name."""
    (root / "qrels").mkdir(parents=True)
    rows = [{"_id": key, "title": "", "text": text} for key, text in CORPUS.items()]
    rows.insert(2, {"_id": "blank", "title": " ", "text": ""})
    (root / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    queries = [{"_id": f"q-{key}", "text": text} for key, text in QUERIES.items()]
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    qrels = ["query-id\tcorpus-id\tscore"]
    qrels += [f"q-{key}\t{key}\t1" for key in QUERIES]
    qrels += ["q-paris\tblank\t1", "q-faiss\tblank\t0"]
    # No train split: fit (and eval) default to test.
    (root / "qrels" / "test.tsv").write_text("\n".join(qrels) + "\n")
    return root


def test_the_first_workflow_reports_skips_and_can_skip_unknown_documents(
    api, server, tmp_path, capsys
):
    beir = _beir(tmp_path / "toy")
    url = ["--collection", "toy", "--url", server.url]
    assert main(["ingest", str(beir), *url]) == 0
    out = capsys.readouterr().out
    assert "ingested 5 documents" in out
    assert "skipped 1 corpus.jsonl row with an empty title and text" in out
    assert "'blank'" in out
    path = "/v1/collections/toy"
    assert api.get(path).json()["documents"] == 5

    before = _calibrator(api, path)
    fit = ["fit", str(beir), *url, "--method", "platt", "--k", "5"]
    assert main(fit) == EXIT_API  # refused as before: the qrels name 'blank'
    err = capsys.readouterr().err
    assert "judgments name documents that are not in collection 'toy'" in err
    assert "'blank'" in err
    assert _calibrator(api, path) == before and _fit_jobs(api, path) == 0

    assert main([*fit, "--skip-unknown"]) == 0
    out = capsys.readouterr().out
    assert "(platt, active=True) on 5 queries" in out
    assert "dropped 2 judgments naming documents not in collection 'toy'" in out
    assert _calibrator(api, path)["status"] == "fitted"


def test_a_fit_job_with_too_few_judged_queries_is_refused_at_post(api):
    path = _collection(api, "too_few")
    few = [j for j in ALL_JUDGMENTS if j["relevance"]][:4]  # 4 queries
    body = {"judgments": few, "method": "platt", "k": 5}
    for route in ("fit-jobs", "calibrators"):  # the same answer either way
        problem = assert_problem(api.post(f"{path}/{route}", json=body), 422)
        assert problem["type"] == "/problems/insufficient-data"
        assert "at least 5 queries" in problem["detail"], problem
        assert "got 4" in problem["detail"], problem
    assert _fit_jobs(api, path) == 0
    # skip with nothing left to fit on is refused too, before any job.
    unknown = [{**j, "document_id": "nope"} for j in ALL_JUDGMENTS[:5]]
    gone = {"judgments": unknown, "unknown_documents": "skip"}
    problem = assert_problem(api.post(f"{path}/fit-jobs", json=gone), 422)
    assert "all 5 name documents that are not in collection" in problem["detail"]
    assert _fit_jobs(api, path) == 0
