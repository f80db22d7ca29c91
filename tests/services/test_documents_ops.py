"""Listing, batch get, delete-by-filter and JSONL export of a collection's documents.

Real SQLite, FTS5 and FAISS through HTTP; the hash embedder stands in for the model
(these endpoints never look at what a vector means).
"""

from __future__ import annotations

import asyncio
import base64
import json

import httpx
import pytest
from fastapi.testclient import TestClient
from normcal_client import AsyncNormcalClient, InvalidRequest, NormcalClient, NotFound

from app.api.app import create_app
from app.cli.main import main
from app.services import documents as documents_service
from app.settings import Limits, Settings
from tests.conftest import assert_problem
from tests.support.live import ThreadServer

pytestmark = pytest.mark.fake_embedder

DOCS = "/v1/collections/kb/documents"
CORPUS = [
    {
        "id": "d0",
        "text": "Lava flows from an erupting volcano.",
        "metadata": {"t": "geo"},
    },
    {
        "id": "d1",
        "text": "Magma chambers feed eruptions.",
        "metadata": {"t": "geo", "n": 1},
    },
    {
        "id": "d2",
        "text": "The piano has eighty-eight keys.",
        "metadata": {"t": "music"},
    },
    {
        "id": "d3",
        "text": "Pianists practise scales daily.",
        "metadata": {"t": "music", "n": True},
    },
    {
        "id": "d4",
        "text": "Coffee beans are roasted.",
        "metadata": {"t": "food", "n": 1},
    },
    {
        "id": "d5",
        "text": "Espresso is brewed under pressure.",
        "metadata": {"t": "food"},
    },
    {
        "id": "d6",
        "text": "Glaciers carve U-shaped valleys.",
        "metadata": {"t": "geo", "n": "1"},
    },
]
IDS = [d["id"] for d in CORPUS]


def _app(tmp_path, embedder, **limits):
    settings = Settings(data_dir=tmp_path / "data", limits=Limits(**limits))
    return create_app(settings, embedder=embedder)


def _fill(c: TestClient, name: str = "kb", docs=CORPUS) -> None:
    assert c.post("/v1/collections", json={"name": name}).status_code == 201
    r = c.put(f"/v1/collections/{name}/documents", json={"documents": docs})
    assert r.is_success, r.text


@pytest.fixture
def kb(tmp_path, embedder):
    with TestClient(_app(tmp_path, embedder, max_page_size=5, max_ids_per_get=4)) as c:
        _fill(c)
        yield c


def _counts(c: TestClient, name: str = "kb") -> tuple[int, int, int]:
    info = c.get(f"/v1/collections/{name}").json()
    return info["documents"], info["lexical_indexed"], info["indexed"]


def _all_pages(c: TestClient, limit: int, between=None) -> list[str]:
    """Ids of every page, following next_cursor (bounded), calling ``between(i)``."""
    seen: list[str] = []
    cursor = None
    for i in range(100):
        params = {"limit": limit, **({"cursor": cursor} if cursor else {})}
        page = c.get(DOCS, params=params).json()
        assert page["count"] == len(page["data"]) <= limit
        seen += [d["id"] for d in page["data"]]
        cursor = page["next_cursor"]
        if cursor is None:
            return seen
        if between is not None:
            between(i)
    raise AssertionError("paging did not end")


# -- listing ----------------------------------------------------------------------
def test_pages_follow_the_cursor_in_write_order(kb):
    first = kb.get(DOCS, params={"limit": 3}).json()
    assert [d["id"] for d in first["data"]] == ["d0", "d1", "d2"]
    assert first["data"][0]["metadata"] == {"t": "geo"}
    assert {"norm", "n_tokens", "truncated", "text"} <= set(first["data"][0])
    assert _all_pages(kb, 3) == IDS
    assert _all_pages(kb, 7 // 2) == IDS
    # A page that ends exactly at the last document says so (no empty extra page).
    last = kb.get(DOCS, params={"limit": 5}).json()
    rest = kb.get(DOCS, params={"limit": 5, "cursor": last["next_cursor"]}).json()
    assert rest["count"] == 2 and rest["next_cursor"] is None


def test_default_page_size_is_capped_by_the_declared_limit(kb):
    page = kb.get(DOCS).json()  # max_page_size=5 here, below the default of 100
    assert page["count"] == 5 and page["next_cursor"] is not None


def test_limit_at_the_bound_is_accepted_one_past_is_a_422(kb):
    assert kb.get(DOCS, params={"limit": 5}).json()["count"] == 5
    body = assert_problem(kb.get(DOCS, params={"limit": 6}))
    assert "limit" in body["detail"]
    assert_problem(kb.get(DOCS, params={"limit": 0}))


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode()


@pytest.mark.parametrize(
    "cursor",
    [
        "garbage!",
        "",
        _b64("v1:abc"),
        _b64("v2:3"),
        _b64("v1:-1"),
        _b64("v1:" + "9" * 30),
    ],
)
def test_a_cursor_the_service_did_not_issue_is_a_422(kb, cursor):
    body = assert_problem(kb.get(DOCS, params={"limit": 2, "cursor": cursor}))
    assert "cursor" in body["detail"]


def test_paging_under_upserts_skips_nothing_and_shows_replacements_at_the_end(kb):
    """Writes between pages: every document present throughout is listed; a
    replaced one (new seq) shows up again at the end, a new one at the end too."""

    def write(i: int) -> None:
        if i == 0:  # after d0..d2 were listed: replace one seen and one not yet seen
            docs = [
                {"id": "d1", "text": "Magma rises.", "metadata": {"v": 2}},
                {"id": "d4", "text": "Roasted beans.", "metadata": {"v": 2}},
                {"id": "new", "text": "A late arrival."},
            ]
            assert kb.put(DOCS, json={"documents": docs}).is_success

    seen = _all_pages(kb, 3, between=write)
    assert seen == ["d0", "d1", "d2", "d3", "d5", "d6", "d1", "d4", "new"]
    assert set(IDS) <= set(seen)


def test_paging_while_another_thread_replaces_documents(tmp_path, embedder):
    """Real concurrency: a writer replaces every document over and over while a
    reader pages; no document is ever missing from the listing."""
    import threading

    with TestClient(_app(tmp_path, embedder)) as c:
        _fill(c)
        stop = threading.Event()
        wrote = threading.Event()

        def writer() -> None:
            for round_ in range(200):  # bounded
                if stop.is_set():
                    return
                for doc in CORPUS:
                    changed = {**doc, "metadata": {"round": round_}}
                    assert c.put(DOCS, json={"documents": [changed]}).is_success
                    wrote.set()

        thread = threading.Thread(target=writer)
        thread.start()
        try:
            assert wrote.wait(timeout=60)
            for _ in range(5):
                assert set(IDS) <= set(_all_pages(c, 2))
        finally:
            stop.set()
            thread.join(timeout=120)
        assert not thread.is_alive()
        assert _counts(c) == (7, 7, 7)


# -- batch get ----------------------------------------------------------------------
def test_batch_get_in_request_order_with_missing_ids(kb):
    r = kb.post(f"{DOCS}/get", json={"ids": ["d3", "nope", "d0", "d3"]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [d["id"] for d in body["data"]] == ["d3", "d0"]
    assert body["count"] == 2 and body["missing"] == ["nope"]
    assert body["data"][0]["metadata"] == {"t": "music", "n": True}


def test_batch_get_bounds_and_bad_bodies(kb):
    assert kb.post(f"{DOCS}/get", json={"ids": IDS[:4]}).json()["count"] == 4
    body = assert_problem(kb.post(f"{DOCS}/get", json={"ids": IDS[:5]}))
    assert "ids" in body["detail"]
    assert_problem(kb.post(f"{DOCS}/get", json={"ids": []}))
    assert_problem(kb.post(f"{DOCS}/get", json={"ids": ["a\x00b"]}))
    assert_problem(kb.post(f"{DOCS}/get", json={"ids": "d0"}))
    assert_problem(kb.post(f"{DOCS}/get", json={"ids": ["d0"], "extra": 1}))


def test_a_document_named_like_a_route_is_still_reachable(kb):
    names = ("get", "delete", "export")
    docs = [{"id": name, "text": f"called {name}"} for name in names]
    assert kb.put(DOCS, json={"documents": docs}).is_success
    assert kb.get(f"{DOCS}/get").json()["text"] == "called get"
    # GET .../export is the export; the document "export" is read by batch get.
    assert len(kb.get(f"{DOCS}/export").text.splitlines()) == 10
    found = kb.post(f"{DOCS}/get", json={"ids": ["export"]}).json()
    assert found["data"][0]["text"] == "called export"
    assert kb.delete(f"{DOCS}/delete").status_code == 204
    assert kb.post(f"{DOCS}/get", json={"ids": ["delete"]}).json()["missing"] == [
        "delete"
    ]


# -- delete by filter -----------------------------------------------------------------
def _search_ids(c: TestClient, query: str, mode: str) -> set[str]:
    r = c.post(
        "/v1/collections/kb/search", json={"query": query, "k": 10, "mode": mode}
    )
    assert r.status_code == 200, r.text
    return {h["id"] for h in r.json()["hits"]}


def test_delete_by_filter_removes_from_sqlite_fts_and_faiss(kb):
    assert "d0" in _search_ids(kb, "volcano lava", "lexical")
    r = kb.post(f"{DOCS}/delete", json={"filter": {"t": "geo"}})
    assert r.status_code == 200, r.text
    assert r.json() == {"deleted": 3}
    assert _counts(kb) == (4, 4, 4)
    gone = {"d0", "d1", "d6"}
    assert kb.post(f"{DOCS}/get", json={"ids": sorted(gone)}).json()[
        "missing"
    ] == sorted(gone)
    assert not gone & _search_ids(kb, "volcano lava glaciers magma", "lexical")
    assert not gone & _search_ids(kb, "volcano lava glaciers magma", "dense")
    assert _all_pages(kb, 5) == ["d2", "d3", "d4", "d5"]


def test_delete_filter_keeps_json_types_apart(kb):
    # n: 1 matches the integer 1, not true nor "1"; several keys must all match.
    r = kb.post(f"{DOCS}/delete", json={"filter": {"n": 1, "t": "food"}})
    assert r.json() == {"deleted": 1}
    assert kb.post(f"{DOCS}/delete", json={"filter": {"n": 1}}).json() == {"deleted": 1}
    left = kb.post(f"{DOCS}/get", json={"ids": ["d1", "d3", "d4", "d6"]}).json()
    assert left["missing"] == ["d1", "d4"]
    assert kb.post(f"{DOCS}/delete", json={"filter": {"t": "none"}}).json() == {
        "deleted": 0
    }
    assert _counts(kb) == (5, 5, 5)


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"filter": {}},
        {"all": False},
        {"filter": {"t": "geo"}, "all": True},
        {"filter": {"t": {"nested": 1}}},
        {"filter": {"t": "geo"}, "unknown": 1},
        {"all": "yes"},
        {"ids": []},
        {"ids": None},
        {"ids": ["d0"], "all": True},
        {"ids": ["d0"], "filter": {"t": "geo"}},
        {"ids": ["a\x00b"]},
        {"ids": "d0"},
        {"ids": IDS[:5]},  # one past max_ids_per_get
    ],
)
def test_bad_delete_bodies_are_422_and_change_nothing(kb, body):
    assert_problem(kb.post(f"{DOCS}/delete", json=body))
    assert _counts(kb) == (7, 7, 7)
    assert _all_pages(kb, 5) == IDS


def test_delete_by_ids_removes_from_sqlite_fts_and_faiss(kb):
    r = kb.post(f"{DOCS}/delete", json={"ids": ["d0", "nope", "d6", "d0"]})
    assert r.status_code == 200, r.text
    assert r.json() == {"deleted": 2}  # unknown ids are no error, not counted
    assert _counts(kb) == (5, 5, 5)
    assert not {"d0", "d6"} & _search_ids(kb, "volcano lava glaciers", "lexical")
    assert not {"d0", "d6"} & _search_ids(kb, "volcano lava glaciers", "dense")
    assert _all_pages(kb, 5) == ["d1", "d2", "d3", "d4", "d5"]
    at_bound = kb.post(f"{DOCS}/delete", json={"ids": ["d1", "d2", "d3", "d4"]})
    assert at_bound.json() == {"deleted": 4}  # max_ids_per_get is 4 here
    assert _counts(kb) == (1, 1, 1)


@pytest.mark.parametrize("index_type", ["flat", "hnsw"])
def test_delete_all_empties_every_index(tmp_path, embedder, index_type):
    settings = Settings(data_dir=tmp_path / "data", index_type=index_type)
    with TestClient(create_app(settings, embedder=embedder)) as c:
        _fill(c)
        assert c.post(f"{DOCS}/delete", json={"all": True}).json() == {"deleted": 7}
        assert _counts(c) == (0, 0, 0)
        assert _search_ids(c, "volcano", "dense") == set()
        page = c.get(DOCS).json()
        assert page == {"count": 0, "data": [], "next_cursor": None}
        _fill_again = [{"id": "d0", "text": "Back again."}]
        assert c.put(DOCS, json={"documents": _fill_again}).is_success
        assert _counts(c) == (1, 1, 1)
        assert _search_ids(c, "back again", "dense") == {"d0"}


# -- unknown collection ---------------------------------------------------------------
def test_unknown_collection_is_404_on_every_new_route(kb):
    base = "/v1/collections/nope/documents"
    assert_problem(kb.get(base), 404)
    assert_problem(kb.post(f"{base}/get", json={"ids": ["d0"]}), 404)
    assert_problem(kb.post(f"{base}/delete", json={"all": True}), 404)
    assert_problem(kb.get(f"{base}/export"), 404)
    assert _counts(kb) == (7, 7, 7)


# -- export -----------------------------------------------------------------------
def test_export_is_jsonl_of_every_document(kb, monkeypatch):
    monkeypatch.setattr(documents_service, "EXPORT_CHUNK", 2)  # several chunks
    r = kb.get(f"{DOCS}/export")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/x-ndjson")
    lines = r.text.splitlines()
    assert r.text.endswith("\n") and len(lines) == 7
    assert [json.loads(line) for line in lines] == CORPUS


def test_export_of_an_empty_collection_is_empty(tmp_path, embedder):
    with TestClient(_app(tmp_path, embedder)) as c:
        assert c.post("/v1/collections", json={"name": "kb"}).status_code == 201
        r = c.get(f"{DOCS}/export")
        assert r.status_code == 200 and r.text == ""


def test_export_round_trips_through_normcal_ingest(tmp_path, embedder, capsys):
    odd = [
        {
            "id": "ü/1 ?x",
            "text": 'Ünïcode text, "quoted"\nover two lines.',
            "metadata": {"deep": {"list": [1, 2.5, None, True]}, "é": "ß"},
        },
    ]
    with ThreadServer(_app(tmp_path, embedder)) as server:
        with NormcalClient(server.url) as client:
            client.create_collection("kb")
            client.upsert_documents("kb", CORPUS + odd)
            exported = tmp_path / "kb.jsonl"
            assert client.export_documents_to("kb", exported) == 8
            assert not (tmp_path / "kb.jsonl.part").exists()
            args = [
                "ingest",
                str(exported),
                "--collection",
                "copy",
                "--url",
                server.url,
            ]
            assert main(args) == 0
            assert "ingested 8 documents" in capsys.readouterr().out

            def everything(name: str) -> list[tuple[str, str, dict]]:
                page = client.list_documents(name, limit=1000)
                assert page.next_cursor is None
                return [(d.id, d.text, d.metadata) for d in page.data]

            assert everything("copy") == everything("kb")
            copied = list(client.export_documents("copy"))
            assert copied == list(client.export_documents("kb"))
            assert copied == exported.read_text(encoding="utf-8").splitlines()


# -- client -----------------------------------------------------------------------
def test_client_methods_sync_and_async(tmp_path, embedder):
    with ThreadServer(_app(tmp_path, embedder, max_page_size=3)) as server:
        with NormcalClient(server.url) as client:
            client.create_collection("kb")
            client.upsert_documents("kb", CORPUS)
            ids, cursor = [], None
            for _ in range(10):
                page = client.list_documents("kb", limit=3, cursor=cursor)
                ids += [d.id for d in page.data]
                cursor = page.next_cursor
                if cursor is None:
                    break
            assert ids == IDS
            found = client.batch_get_documents("kb", ["d2", "zz"])
            assert [d.id for d in found.data] == ["d2"] and found.missing == ["zz"]
            with pytest.raises(InvalidRequest):
                client.list_documents("kb", limit=4)
            with pytest.raises(InvalidRequest):
                client.delete_documents_where("kb")
            with pytest.raises(NotFound):
                next(client.export_documents("nope"))
            with pytest.raises(NotFound):
                client.export_documents_to("nope", tmp_path / "nope.jsonl")
            assert not list(tmp_path.glob("nope.jsonl*"))
            assert client.delete_documents_where("kb", {"t": "music"}) == 2

        async def run() -> None:
            async with AsyncNormcalClient(server.url) as client:
                page = await client.list_documents("kb")
                assert [d.id for d in page.data] == ["d0", "d1", "d4"]
                found = await client.batch_get_documents("kb", ["d5"])
                assert found.count == 1
                lines = [line async for line in client.export_documents("kb")]
                assert [json.loads(line)["id"] for line in lines] == ids
                path = tmp_path / "async.jsonl"
                assert await client.export_documents_to("kb", path) == 5
                assert path.read_text(encoding="utf-8").splitlines() == lines
                paged = [d.id async for d in client.iter_documents("kb", page_size=2)]
                assert paged == ids
                got = await client.get_documents("kb", ["d5", "zz", "d0"], batch_size=1)
                assert [d.id for d in got] == ["d5", "d0"]
                with pytest.raises(NotFound):
                    await client.delete_documents("kb", ["d0", "zz"])
                assert (await client.get_collection("kb")).documents == 5
                deleted = await client.delete_documents(
                    "kb", ["d0", "zz"], missing_ok=True
                )
                assert deleted == 1
                assert await client.delete_documents_where("kb", all=True) == 4

        ids = ["d0", "d1", "d4", "d5", "d6"]
        asyncio.run(run())


def test_client_batch_get_and_delete_send_one_request_per_batch(tmp_path, embedder):
    """``get_documents``/``delete_documents`` use the batch routes, not one per id."""
    sent: list[str] = []
    with ThreadServer(_app(tmp_path, embedder, max_page_size=3)) as server:
        hooks = {"request": [lambda request: sent.append(request.url.path)]}
        with httpx.Client(base_url=server.url, event_hooks=hooks) as http:
            client = NormcalClient(http_client=http)
            client.create_collection("kb")
            client.upsert_documents("kb", CORPUS)
            sent.clear()
            found = client.get_documents("kb", [*IDS, "zz", "d0"], batch_size=3)
            assert [d.id for d in found] == IDS
            assert sent == [f"{DOCS}/get"] * 3  # 8 distinct ids, 3 a request
            sent.clear()
            assert [d.id for d in client.iter_documents("kb", page_size=3)] == IDS
            assert sent == [DOCS] * 3
            sent.clear()
            with pytest.raises(NotFound) as caught:
                client.delete_documents("kb", ["d0", "zz", "d1"], batch_size=2)
            assert "'zz'" in caught.value.detail
            assert sent == [f"{DOCS}/get"] * 2  # looked up, nothing deleted
            assert client.get_collection("kb").documents == 7
            sent.clear()
            assert client.delete_documents("kb", IDS[:5], batch_size=2) == 5
            assert sent == [f"{DOCS}/get"] * 3 + [f"{DOCS}/delete"] * 3
            assert client.delete_documents("kb", ["d0", "d6"], missing_ok=True) == 1
            assert [d.id for d in client.iter_documents("kb")] == ["d5"]


class _InjectedFailure(Exception):
    pass


def _fail(*_: object) -> None:
    raise _InjectedFailure


@pytest.mark.parametrize(
    ("write", "step"),
    [
        ("upsert", "tokens"),
        ("upsert", "faiss"),
        ("delete", "faiss"),  # a delete tokenises nothing
        ("delete by filter", "faiss"),
    ],
)
def test_a_write_that_fails_is_a_500_that_changed_nothing(
    tmp_path, embedder, monkeypatch, step, write
):
    """A failure inside the write's unit (before COMMIT): 500, nothing changed."""
    app = _app(tmp_path, embedder)
    with TestClient(app, raise_server_exceptions=False) as c:
        _fill(c)
        assert c.post("/v1/collections/kb/search", json={"query": "x"}).is_success
        before = (
            _counts(c),
            _search_ids(c, "volcano lava", "lexical"),
            _search_ids(c, "volcano lava", "dense"),
        )
        collection = c.app_state["service"].context.registry.get("kb")
        assert collection._store.wait_lexical(timeout=60)  # the postings serve
        if step == "tokens":
            monkeypatch.setattr(collection._store._postings, "tokens_of", _fail)
        else:
            monkeypatch.setattr(collection.index, "remove", _fail)
            monkeypatch.setattr(collection.index, "add", _fail)
        requests = {
            "upsert": lambda: c.put(
                DOCS, json={"documents": [{"id": "d0", "text": "new lava"}]}
            ),
            "delete": lambda: c.delete(f"{DOCS}/d0"),
            "delete by filter": lambda: c.post(
                f"{DOCS}/delete", json={"filter": {"t": "geo"}}
            ),
        }
        assert_problem(requests[write](), 500)
        monkeypatch.undo()
        after = (
            _counts(c),
            _search_ids(c, "volcano lava", "lexical"),
            _search_ids(c, "volcano lava", "dense"),
        )
        assert after == before
        assert c.get(f"{DOCS}/d0").json()["text"] == CORPUS[0]["text"]
