"""Issue 21, defects 10, 12 and 13 against a real ``normcal serve`` with an API key.

10: a profile carrying markup in its report fields is imported, then its report page is
    rendered: the markup appears escaped, never as a tag, and in chromium (through the
    judging page's report viewer, which fetches it with the key) no script of it runs.
12: every HTML answer carries a Content-Security-Policy without inline script,
    ``frame-ancestors 'none'``, ``X-Frame-Options``, ``nosniff`` and a
    ``Referrer-Policy``.
13: the poison inputs of ``test_input.py`` and broken profiles answer 4xx problems whose
    texts are the service's own (the field and the rule), never an exception's, and
    change nothing.

One server for the module: every test leaves the collection as it found it, apart from
the calibrators the XSS test imports (which the others do not count on).
"""

from __future__ import annotations

import copy
import json
import re
import sqlite3
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.browser import Browser
from tests.support.server import ServerProcess

KEY = "seams-html-key"
AUTH = {"authorization": f"Bearer {KEY}"}
KB = "/v1/collections/kb"
SEARCH = f"{KB}/search"
# Markup that would run if a page took it as HTML: a tag, an attribute handler, an
# attribute break-out. The page's title records a run.
PAYLOAD = "<script>document.title='pwned'</script><img src=x onerror=\"document.title='pwned'\">"
# What a detail must never hold: a traceback, numpy's or Python's exception wording.
FRAGMENTS = (
    "Traceback",
    "numpy",
    "could not convert",
    "invalid literal",
    "ValueError",
    "TypeError",
    "KeyError",
    "Error:",
    "dtype(",
    "data type",
    "ufunc",
    "not understood",
    "cannot reshape",
    "Value error,",
    'File "',
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    data = tmp_path_factory.mktemp("seams-html") / "data"
    live = ServerProcess(data, env={"NORMCAL_API_KEY": KEY}).start()
    try:
        with httpx.Client(base_url=live.url, headers=AUTH, timeout=60) as api:
            api.post("/v1/collections", json={"name": "kb"}).raise_for_status()
            docs = [
                {"id": "paris", "text": "Paris is the capital of France."},
                {"id": "rome", "text": "Rome is the capital of Italy."},
                {"id": "tea", "text": "Green tea is brewed at 80 degrees."},
            ]
            api.put(f"{KB}/documents", json={"documents": docs}).raise_for_status()
        yield live
    finally:
        live.stop()


@pytest.fixture
def api(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=60) as client:
        yield client


def _export(api: httpx.Client) -> dict[str, Any]:
    """The export of the collection's default calibrator (the shipped profile)."""
    default = api.get(KB).json()["calibrator"]["id"]
    r = api.get(f"{KB}/calibrators/{default}/export")
    r.raise_for_status()
    return dict(r.json())


def _stored_ids(server: ServerProcess) -> set[str]:
    """The calibrator ids in the collection's SQLite file, read beside the server."""
    path = server.data_dir / "kb.sqlite3"
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        return {row[0] for row in conn.execute("SELECT id FROM calibrators")}


def _state(api: httpx.Client, server: ServerProcess) -> dict[str, Any]:
    """What an attack must not change: counts, the serving calibrator, a search."""
    info = api.get(KB).json()
    hits = api.post(SEARCH, json={"query": "capital of France", "k": 3}).json()["hits"]
    return {
        "documents": info["documents"],
        "indexed": info.get("indexed"),
        "calibrator": info["calibrator"]["id"],
        "stored_calibrators": _stored_ids(server),
        "search": [(h["id"], round(h["score"], 6), h["probability"]) for h in hits],
        "feedback": api.get(f"{KB}/feedback").json()["count"],
    }


def _hostile_profile(export: dict[str, Any], *, typed: bool) -> dict[str, Any]:
    """The export with markup in its report's text fields; with ``typed=False`` also
    in its number fields, as strings (what the old decoder let through)."""
    profile = copy.deepcopy(export)
    report = profile["report"]["fields"]
    lift = report["norm_lift"]["fields"]
    lift["reason"] = PAYLOAD
    lift["base_method"] = PAYLOAD
    report["evidence_lift"] = {  # a tuple, as the encoder writes one
        "__tuple__": [
            {
                "class": "GroupLift",
                "format_version": 1,
                "fields": {
                    "group": PAYLOAD,
                    "model": "m",
                    "base": "b",
                    "nll_gain": 0.1,
                    "nll_gain_se": 0.01,
                    "brier_change": -0.01,
                    "verdict": PAYLOAD,
                    "reason": PAYLOAD,
                },
            }
        ]
    }
    if not typed:
        for field in ("n_queries", "n_pairs", "n_positive", "k", "n_splits"):
            report[field] = PAYLOAD
        report["abstain"] = {
            "class": "AbstainPolicy",
            "format_version": 1,
            "fields": {
                "threshold": 0.5,
                "target_risk": 0.1,
                "delta": 0.1,
                "n_calibration": PAYLOAD,
                "empirical_risk": 0.05,
                "coverage": 0.8,
                "certified": True,
                "method": PAYLOAD,
                "p_value": 0.01,
            },
        }
    return profile


def _assert_escaped(page: str) -> None:
    """The payload is nowhere a tag or an attribute, and there is no script at all."""
    assert "<script" not in page.lower() and "<img src=x" not in page
    # Every tag of the page is one the template wrote: none carries an event handler.
    # (attribute values, which hold escaped text, left out)
    tags = [re.sub(r'"[^"]*"', '""', t) for t in re.findall(r"<[a-zA-Z][^>]*>", page)]
    assert not [t for t in tags if re.search(r"\son\w+\s*=", t)], tags


# -- defect 10: stored XSS on the report page -----------------------------------------
@pytest.mark.server
@pytest.mark.parametrize("typed", [True, False], ids=["text-fields", "number-fields"])
def test_markup_in_an_imported_profile_is_escaped_on_the_report_page(
    api, server, typed
):
    before = _stored_ids(server)
    profile = _hostile_profile(_export(api), typed=typed)
    r = api.post(f"{KB}/calibrators/import", json={"profile": profile})
    # Typed report fields refuse the strings (422, nothing stored); the old decoder
    # stored them: whatever was stored is rendered, and rendered escaped.
    new = _stored_ids(server) - before
    if r.status_code == 201:
        assert new == {r.json()["id"]}
    else:
        assert 400 <= r.status_code < 600, r.text
    for calibrator in new:
        page = api.get(f"{KB}/calibrators/{calibrator}/report")
        assert page.status_code == 200, page.text
        _assert_escaped(page.text)
        assert (
            "&lt;script&gt;document.title=&#39;pwned&#39;&lt;/script&gt;" in page.text
        )
        if typed:
            assert page.text.count("&lt;script&gt;") >= 5  # reason, base, 3 evidence
    if typed:
        assert r.status_code == 201, r.text  # text fields are text: stored, shown


@pytest.mark.server
def test_no_script_of_an_imported_profile_runs_in_chromium(
    api, server, chromium, tmp_path
):
    r = api.post(
        f"{KB}/calibrators/import",
        json={"profile": _hostile_profile(_export(api), typed=True)},
    )
    assert r.status_code == 201, r.text
    calibrator = r.json()["id"]
    viewer = f"{server.url}/ui/collections/kb/calibrators/{calibrator}/report"
    with Browser(chromium, tmp_path / "profile") as browser:
        browser.goto(viewer)  # no key yet: the viewer says so
        assert "Unauthorized" in browser.wait_for(
            "document.body.dataset.state === 'error' && error.textContent"
        )
        browser.evaluate(
            f"key.value = {KEY!r}; key.dispatchEvent(new Event('change')); true"
        )
        browser.wait_for("document.body.dataset.state === 'shown'")
        browser.wait_for(
            "document.getElementById('reliability').complete && "
            "document.getElementById('reliability').naturalWidth"
        )
        # The payload is shown as text, where the template put it; nothing ran.
        shown = browser.evaluate("document.getElementById('norm-lift').textContent")
        assert PAYLOAD in shown
        assert browser.evaluate("document.title") == f"normcal calibrator {calibrator}"
        assert (
            browser.evaluate("document.querySelectorAll('#report script').length") == 0
        )
        assert browser.evaluate("document.querySelectorAll('#report img').length") == 1
        # The same page straight from /v1 (the key sent by the browser on no link:
        # an extra header for this one navigation) renders it escaped too.
        browser.call("Network.enable")
        browser.call("Network.setExtraHTTPHeaders", headers=AUTH)
        browser.goto(f"{server.url}{KB}/calibrators/{calibrator}/report")
        browser.wait_for(
            "document.getElementById('reliability').complete && "
            "document.getElementById('reliability').naturalWidth"
        )
        assert browser.evaluate("document.title") == f"normcal calibrator {calibrator}"
        assert PAYLOAD in browser.evaluate(
            "document.getElementById('norm-lift').textContent"
        )


# -- defect 12: security headers ------------------------------------------------------
def _assert_secure(response: httpx.Response) -> str:
    policy = response.headers["content-security-policy"]
    directives = dict(
        [*d.strip().split(" ", 1), ""][:2] for d in policy.split(";") if d.strip()
    )
    script_src = directives["script-src"].split()
    assert "'self'" in script_src
    assert not {"'unsafe-inline'", "'unsafe-eval'", "*", "data:"} & set(script_src)
    assert directives["frame-ancestors"] == "'none'"
    assert response.headers["x-frame-options"] == "DENY"
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["referrer-policy"] == "no-referrer"
    return policy


@pytest.mark.server
def test_every_page_carries_the_security_headers(api, server):
    calibrator = api.get(KB).json()["calibrator"]["id"]
    pages = [
        "/",
        "/ui/collections/kb/judge",
        f"/ui/collections/kb/calibrators/{calibrator}/report",
        f"{KB}/calibrators/{calibrator}/report",
        "/docs",
        "/redoc",
        "/docs/oauth2-redirect",
    ]
    for path in pages:
        r = api.get(path)
        assert r.status_code == 200, (path, r.text)
        assert r.headers["content-type"].startswith("text/html"), path
        _assert_secure(r)
    # The service's own pages allow no inline script at all; /docs allows Swagger UI's
    # one configuration script by its hash, nothing else inline.
    for path in pages[:4]:
        script_src = re.search(
            r"script-src ([^;]*)", api.get(path).headers["content-security-policy"]
        ).group(1)
        assert script_src == "'self'", path
    docs = api.get("/docs").headers["content-security-policy"]
    assert re.search(r"script-src 'self' 'sha256-[A-Za-z0-9+/=]+';", docs), docs
    # Everything else too, refusals included.
    for r in (
        api.get("/ui/static/judge.js"),
        api.get(f"{KB}/calibrators/{calibrator}/reliability.png"),
        api.get(KB),
        httpx.get(f"{server.url}{KB}"),  # 401, no key
        api.get("/v1/collections/nope"),  # 404
    ):
        assert r.status_code in (200, 401, 404)
        _assert_secure(r)


# -- defect 13: errors in our words ---------------------------------------------------
DEEP = "[" * 10_000 + "]" * 10_000
RAW_POISON = [  # (method, path, raw JSON body) from tests/faults/test_input.py
    (
        "PUT",
        f"{KB}/documents",
        '{"documents": [{"id": "p", "text": "t", "metadata": {"a": NaN}}]}',
    ),
    (
        "PUT",
        f"{KB}/documents",
        '{"documents": [{"id": "p", "text": "t", "metadata": {"a": 1e400}}]}',
    ),
    (
        "PUT",
        f"{KB}/documents",
        '{"documents": [{"id": "p", "text": "t", "metadata": {"a": 9223372036854775808}}]}',
    ),
    (
        "PUT",
        f"{KB}/documents",
        '{"documents": [{"id": "p", "text": "t", "metadata": {"\\ud800": 1}}]}',
    ),
    ("PUT", f"{KB}/documents", '{"documents": [{"id": "p\\ud800", "text": "t"}]}'),
    ("PUT", f"{KB}/documents", '{"documents": [{"id": "a\\u0000b", "text": "t"}]}'),
    (
        "PUT",
        f"{KB}/documents",
        '{"documents": [{"id": "p", "text": "t", "metadata": {"a": ' + DEEP + "}}]}",
    ),
    ("PUT", f"{KB}/documents", '{"documents": [{"id": "p", "text": 5}]}'),
    ("PUT", f"{KB}/documents", '{"documents": "nope"}'),
    ("PUT", f"{KB}/documents", "{not json"),
    ("POST", SEARCH, '{"query": "q", "filter": {"lang": NaN}}'),
    ("POST", SEARCH, '{"query": "q", "filter": {"lang": 9223372036854775808}}'),
    ("POST", SEARCH, '{"query": "q", "filter": {"a": ' + DEEP + "}}"),
    ("POST", SEARCH, '{"query": "q\\ud800"}'),
    ("POST", SEARCH, '{"query": "q", "k": "5"}'),
    ("POST", SEARCH, '{"query": "q", "k": 1e400}'),
    ("POST", SEARCH, '{"query": "q", "k": -1}'),
    ("POST", SEARCH, '{"query": "q", "min_probability": "0.5"}'),
    ("POST", SEARCH, '{"query": "q", "queries": ["q"]}'),
    ("POST", SEARCH, '{"query": "q", "bogus": 1}'),
    ("POST", SEARCH, DEEP),
    (
        "POST",
        f"{KB}/feedback",
        '{"judgments": [{"query": "q", "document_id": "paris", "relevance": 9223372036854775808}]}',
    ),
    (
        "POST",
        f"{KB}/feedback",
        '{"judgments": [{"query": "q", "document_id": "paris", "relevance": true}]}',
    ),
    (
        "POST",
        f"{KB}/feedback",
        '{"judgments": [{"query": "q\\ud800", "document_id": "paris", "relevance": 1}]}',
    ),
    ("POST", f"{KB}/calibrators", '{"judgments": [], "k": "20"}'),
    ("POST", f"{KB}/calibrators", '{"abstain_delta": "0.1"}'),
    ("POST", f"{KB}/calibrators", '{"method": "nope"}'),
    ("POST", f"{KB}/calibrators/import", '{"profile": [1, 2]}'),
    ("POST", f"{KB}/calibrators/import", '{"profile": {}}'),
    ("GET", f"{KB}/documents/a%00b", ""),
    ("GET", f"{KB}/feedback?limit=0", ""),
    ("GET", f"{KB}/feedback?cursor=%%%", ""),
]


def _broken_profiles(export: dict[str, Any]) -> list[dict[str, Any]]:
    """Profiles whose decoding or one-point trial failed inside numpy or Python."""

    def edit(change: Any) -> dict[str, Any]:
        profile = copy.deepcopy(export)
        change(profile)
        return profile

    def coef(profile: dict[str, Any]) -> dict[str, Any]:
        return dict(profile["estimator"]["state"]["coef_"])

    def counts(profile: dict[str, Any]) -> dict[str, Any]:
        return dict(profile["report"]["fields"]["reliability"]["fields"]["counts"])

    return [
        edit(lambda p: p["estimator"]["state"]["coef_"].update(dtype="S10")),
        edit(lambda p: p["estimator"]["state"]["coef_"].update(dtype="zz")),
        edit(lambda p: p["estimator"]["state"]["coef_"].update(shape=[3, 3])),
        edit(
            lambda p: p["estimator"]["state"]["coef_"].update(
                __ndarray__=["a"] * len(coef(p)["__ndarray__"])
            )
        ),
        edit(
            lambda p: p["report"]["fields"]["reliability"]["fields"]["counts"].update(
                __ndarray__=["a"] * len(counts(p)["__ndarray__"])
            )
        ),
        edit(lambda p: p["doc_ref"]["params"].update(bogus=1)),
        edit(lambda p: p["doc_ref"]["params"].update(clip="abc")),
        edit(lambda p: p["doc_ref"]["state"].pop("slope_")),
        edit(lambda p: p["report"].update(fields=[1])),
        edit(lambda p: p.update(created_at="yesterday")),
        edit(lambda p: p.pop("estimator")),
    ]


def _assert_own_words(response: httpx.Response) -> dict[str, Any]:
    assert 400 <= response.status_code < 500, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body = dict(response.json())
    texts = [body["detail"]] + [str(e.get("msg")) for e in body.get("errors") or []]
    for text in texts:
        leaked = [f for f in FRAGMENTS if f in text]
        assert not leaked, (leaked, text)
    return body


@pytest.mark.server
def test_error_details_name_the_field_and_rule_never_an_exception(api, server):
    before = _state(api, server)
    for method, path, body in RAW_POISON:
        r = api.request(
            method,
            path,
            content=body.encode(),
            headers={"content-type": "application/json"} if body else {},
        )
        _assert_own_words(r)
    for profile in _broken_profiles(_export(api)):
        r = api.post(f"{KB}/calibrators/import", json={"profile": profile})
        body = _assert_own_words(r)
        assert r.status_code == 422
        assert body["detail"].startswith(
            ("not a valid calibration profile", "profile")
        ), body
    assert _state(api, server) == before


def test_a_library_text_inside_a_domain_error_is_withheld():
    """The rule itself, without a server: ``public_detail`` of a wrapped error."""
    from app.api.errors import WITHHELD, public_detail
    from app.exceptions import InvalidRequestError
    from calibration.exceptions import UnsupportedFormatError

    def wrapped(cause: Exception, outer: str) -> Exception:
        try:
            try:
                raise cause
            except Exception as error:
                raise UnsupportedFormatError(f"Malformed X payload: {error}") from error
        except UnsupportedFormatError as error:
            try:
                raise InvalidRequestError(f"{outer}: {error}") from error
            except InvalidRequestError as top:
                return top

    numpy_text = wrapped(
        ValueError("could not convert string to float: 'a'"), "profile"
    )
    assert public_detail(numpy_text) == f"profile: Malformed X payload: {WITHHELD}"
    missing = wrapped(KeyError("slope_"), "profile")
    assert public_detail(missing) == (
        "profile: Malformed X payload: the field 'slope_' is missing"
    )
    sqlite = sqlite3.DatabaseError("file is not a database")
    try:
        try:
            raise sqlite
        except sqlite3.Error as error:
            raise InvalidRequestError(f"snapshot: cannot open: {error}") from error
    except InvalidRequestError as top:
        assert public_detail(top) == f"snapshot: cannot open: {WITHHELD}"
    own = InvalidRequestError("filter: lang: number must be finite")
    assert public_detail(own) == str(own)
    json.dumps(public_detail(own))  # a plain string
