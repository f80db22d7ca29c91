"""Property-based fuzzing of the app against its own OpenAPI schema (schemathesis).

Real app in-process (FAISS, SQLite; the deterministic fake embedder, since the
schema and not the model is under test), a pre-created collection so that path
parameters can hit something, and small limits.
Properties: never a 5xx; responses conform to the schema; every 4xx is problem+json
carrying the request id in ``instance``.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.python import asgi

from app.api.app import create_app
from app.settings import Limits, Settings
from tests.support.fakes import HashEmbedder

COLLECTION = "kb"
LIMITS = Limits(
    max_texts_per_request=4,
    max_text_chars=200,
    max_documents_per_upsert=4,
    max_queries_per_search=4,
    max_k=10,
    max_metadata_bytes=512,
    max_id_chars=64,
    max_judgments_per_fit=50,
    max_body_bytes=64 * 1024,
)


@schemathesis.serializer("application/vnd.sqlite3")
def _snapshot_file(ctx: schemathesis.SerializationContext, value: object) -> bytes:
    """A snapshot upload's body: whatever bytes were generated (never a usable file)."""
    return value if isinstance(value, bytes) else str(value).encode()


# Built at import: schemathesis needs the schema to generate the test cases.
# Only a path: the lifespan creates it, so collecting the tests leaves nothing behind.
_DATA_DIR = Path(tempfile.gettempdir()) / f"normcal-fuzz-{uuid.uuid4().hex}"
APP = create_app(
    Settings(data_dir=_DATA_DIR, limits=LIMITS, worker_threads=2, api_key=None),
    embedder=HashEmbedder(),
)
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)


@pytest.fixture(scope="module")
def fuzz_client():
    # schemathesis' ASGI client runs the app's lifespan once (until process exit).
    with asgi.get_client(APP) as client:
        r = client.post("/v1/collections", json={"name": COLLECTION})
        assert r.status_code in (201, 409), r.text
        docs = [
            {"id": f"d{i}", "text": t, "metadata": {"i": i}}
            for i, t in enumerate(["alpha beta", "gamma delta", "epsilon"])
        ]
        r = client.put(
            f"/v1/collections/{COLLECTION}/documents", json={"documents": docs}
        )
        assert r.status_code == 200, r.text
        yield client
    shutil.rmtree(_DATA_DIR, ignore_errors=True)


@schema.parametrize()
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_api_conforms_and_never_fails(case, fuzz_client):
    params = case.path_parameters
    # Aim most cases at the existing collection; a DELETE keeps its random name.
    if params and "name" in params and case.method.upper() != "DELETE":
        params["name"] = COLLECTION
    response = case.call(session=fuzz_client)
    case.validate_response(
        response,
        checks=[
            not_a_server_error,
            status_code_conformance,
            content_type_conformance,
            response_schema_conformance,
        ],
    )
    if 400 <= response.status_code < 500:
        assert response.headers["content-type"][0] == "application/problem+json"
        body = response.json()
        assert body["status"] == response.status_code
        assert body["instance"].startswith("urn:request:")
