"""The client's wire models and routes against the live server's OpenAPI document.

Every server schema component must have a client model of the same name with the
same fields, required-ness and types (enums included), so adding, renaming or
retyping a server field fails here until the client follows. Every route must be a
client endpoint with the same request and response models. Constraints (ranges,
lengths, patterns) are the server's to enforce and are not compared.
"""

from __future__ import annotations

from typing import Any

import pytest
from normcal_client import _endpoints as ep
from normcal_client import _models
from pydantic import BaseModel

REF = "#/components/schemas/"
# Routes the client leaves out on purpose: Prometheus scrapes /metrics.
SERVER_ONLY_ROUTES = {("GET", "/metrics")}


@pytest.fixture(scope="module")
def openapi(tmp_path_factory) -> dict[str, Any]:
    from app.api.app import create_app
    from app.settings import Settings

    settings = Settings(data_dir=tmp_path_factory.mktemp("contract"))
    return create_app(settings).openapi()


def client_models() -> dict[str, type[BaseModel]]:
    bases = {_models.RequestModel, _models.ResponseModel}
    return {
        name: obj
        for name, obj in vars(_models).items()
        if isinstance(obj, type) and issubclass(obj, tuple(bases)) and obj not in bases
    }


def shape(schema: dict[str, Any]) -> Any:
    """The type structure of a JSON schema, without titles or constraints."""
    if "$ref" in schema:
        return ("ref", schema["$ref"].rsplit("/", 1)[-1])
    if "anyOf" in schema:
        return ("anyOf", frozenset(shape(s) for s in schema["anyOf"]))
    if "enum" in schema:
        return ("enum", frozenset(schema["enum"]))
    if "const" in schema:
        return ("enum", frozenset([schema["const"]]))
    kind = schema.get("type")
    if kind == "array":
        return ("array", shape(schema.get("items", {})))
    if kind == "object":
        extra = schema.get("additionalProperties", True)
        return ("object", shape(extra) if isinstance(extra, dict) else extra)
    return ("type", kind) if kind else ("any",)


def differences(server: dict[str, Any], client: dict[str, Any]) -> list[str]:
    """How a client component's schema departs from the server's."""
    found = []
    s_props, c_props = server.get("properties", {}), client.get("properties", {})
    for name in sorted(set(s_props) - set(c_props)):
        found.append(f"field {name!r} is missing from the client")
    for name in sorted(set(c_props) - set(s_props)):
        found.append(f"field {name!r} is unknown to the server")
    s_req, c_req = set(server.get("required", [])), set(client.get("required", []))
    if s_req != c_req:
        found.append(f"required {sorted(s_req)} on the server, {sorted(c_req)} here")
    for name in sorted(set(s_props) & set(c_props)):
        if shape(s_props[name]) != shape(c_props[name]):
            found.append(
                f"field {name!r}: {shape(s_props[name])} != {shape(c_props[name])}"
            )
        if "default" in s_props[name] and s_props[name].get("default") != c_props[
            name
        ].get("default"):
            found.append(f"field {name!r}: the default differs")
    return found


def client_schema(model: type[BaseModel]) -> dict[str, Any]:
    mode = "validation" if issubclass(model, _models.RequestModel) else "serialization"
    return model.model_json_schema(ref_template=REF + "{model}", mode=mode)


def test_every_server_schema_has_a_client_model(openapi):
    server = set(openapi["components"]["schemas"])
    assert server == set(client_models()), (
        "client models and server schema components differ: "
        f"server only {sorted(server - set(client_models()))}, "
        f"client only {sorted(set(client_models()) - server)}"
    )


@pytest.mark.parametrize("name", sorted(client_models()))
def test_client_model_matches_the_server_schema(openapi, name):
    server = openapi["components"]["schemas"][name]
    model = client_models()[name]
    assert differences(server, client_schema(model)) == []
    extra = model.model_config.get("extra")
    assert extra == ("forbid" if issubclass(model, _models.RequestModel) else "allow")


def test_a_new_server_field_fails_the_contract(openapi):
    """The comparison sees drift: a field the client lacks, a retyped one."""
    server = openapi["components"]["schemas"]["FitRequest"]
    client = client_schema(_models.FitRequest)
    grown = {
        **server,
        "properties": {**server["properties"], "new": {"type": "integer"}},
    }
    assert differences(grown, client) == ["field 'new' is missing from the client"]
    retyped = {
        **server,
        "properties": {**server["properties"], "allow_reorder": {"type": "string"}},
    }
    assert any("allow_reorder" in d for d in differences(retyped, client))
    judgment = openapi["components"]["schemas"]["Judgment"]
    as_float = {**judgment["properties"]["relevance"], "type": "number"}
    drifted = {
        **judgment,
        "properties": {**judgment["properties"], "relevance": as_float},
    }
    assert differences(drifted, client_schema(_models.Judgment)) != []


def _operations(openapi) -> set[tuple[str, str]]:
    return {
        (method.upper(), path)
        for path, ops in openapi["paths"].items()
        for method in ops
    }


def test_every_route_is_a_client_endpoint(openapi):
    client = {(e.method, e.path) for e in ep.ENDPOINTS}
    assert _operations(openapi) - SERVER_ONLY_ROUTES == client


def _refs(schema: dict[str, Any]) -> set[str]:
    if "$ref" in schema:
        return {schema["$ref"].removeprefix(REF)}
    return {r for s in schema.get("anyOf", []) for r in _refs(s)}


@pytest.mark.parametrize("endpoint", ep.ENDPOINTS, ids=lambda e: f"{e.method} {e.path}")
def test_endpoint_models_match_the_route(openapi, endpoint):
    operation = openapi["paths"][endpoint.path][endpoint.method.lower()]
    body = operation.get("requestBody", {}).get("content", {}).get("application/json")
    if endpoint.request is None:
        assert body is None
    else:
        assert body is not None and _refs(body["schema"]) == {endpoint.request.__name__}
    ok = {code: r for code, r in operation["responses"].items() if code.startswith("2")}
    assert len(ok) == 1
    content = next(iter(ok.values())).get("content", {})
    if endpoint.response is type(None):
        assert content == {}
    elif endpoint.response is bytes:
        assert set(content) == {endpoint.accept}
    elif endpoint.response is str:
        assert set(content) == {endpoint.accept}
        assert content[endpoint.accept]["schema"] == {"type": "string"}
    else:
        assert endpoint.response.__name__ in _refs(
            content["application/json"]["schema"]
        )
