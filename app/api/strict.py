"""Unknown input is an error that names it: query parameters, and other stores' fields.

A route takes the query parameters it declares and nothing else: one it does not
know (``GET .../documents?filter=...``, say) is a 422 naming it, never silently
ignored. :func:`refuse_unknown_query` is one dependency of the whole app, derived
from each route's own declaration, so no route lists its parameters twice.

A body field another vector store uses (``top_k``, ``where``, ``n_results`` …) is
refused as any unknown field is, and the validation problem names the field to use
instead: :data:`HABITS`, read by the validation handler (:func:`hint`).
"""

from __future__ import annotations

import types
from typing import Annotated, Any, Union, get_args, get_origin

from fastapi import Request
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel

_QUERY_NAMES = "normcal_query_names"  # the route attribute caching its parameters


def query_names(route: APIRoute) -> frozenset[str]:
    """The query parameters ``route`` declares, its dependencies' included."""
    cached: frozenset[str] | None = getattr(route, _QUERY_NAMES, None)
    if cached is None:
        names: set[str] = set()
        pending: list[Dependant] = [route.dependant]
        while pending:
            dependant = pending.pop()
            names.update(field.alias for field in dependant.query_params)
            pending.extend(dependant.dependencies)
        cached = frozenset(names)
        setattr(route, _QUERY_NAMES, cached)
    return cached


async def refuse_unknown_query(request: Request) -> None:
    """Refuse (422) query parameters the matched route does not declare, naming them.

    ``async``, so it runs on the event loop, not in a worker thread.
    """
    route = request.scope.get("route")
    if not isinstance(route, APIRoute):
        return
    known = query_names(route)
    unknown = [
        name for name in dict.fromkeys(request.query_params) if name not in known
    ]
    if not unknown:
        return
    takes = ", ".join(sorted(known)) if known else "no query parameters"
    raise RequestValidationError(
        [
            {
                "type": "extra_forbidden",
                "loc": ("query", name),
                "msg": _unknown_parameter(name, takes),
                "input": None,
            }
            for name in unknown
        ]
    )


def _unknown_parameter(name: str, takes: str) -> str:
    note = QUERY_HABITS.get(name)
    return f"unknown query parameter (this route takes {takes})" + (
        f"; {note}" if note else ""
    )


# What a query parameter from another API's habits means here.
_FILTER_IN_BODY = (
    'a metadata filter goes in a JSON body: POST .../documents/query {"filter": ...} '
    "lists the documents it matches, POST .../documents/count counts them"
)
QUERY_HABITS = dict.fromkeys(("filter", "where", "filters"), _FILTER_IN_BODY)


# An unknown body field another store uses -> (the fields to use here, the first the
# refusing model has; a note). Named only where the model has one of them (or the note
# alone, with no field), so a hint never points at a field the route does not take.
_HITS = ("k", "limit")  # a search's hits, a listing's page
_PATH = "the collection is in the path: /v1/collections/{name}/..."
HABITS: dict[str, tuple[tuple[str, ...], str]] = {
    # how many: Pinecone/LlamaIndex, Chroma, Qdrant, Elasticsearch, Cohere
    "top_k": (_HITS, ""),
    "topK": (_HITS, ""),
    "n_results": (_HITS, ""),
    "limit": (_HITS, ""),
    "size": (_HITS, ""),
    "top_n": (_HITS, ""),
    "similarity_top_k": (_HITS, ""),
    # the metadata filter: Chroma, LlamaIndex, Qdrant, Milvus
    "where": (("filter",), ""),
    "filters": (("filter",), ""),
    "query_filter": (("filter",), ""),
    "expr": (("filter",), ""),
    "where_document": (
        (),
        "filters match metadata; BM25 (mode lexical or hybrid) matches the text",
    ),
    # the query: Chroma, OpenSearch, Cohere
    "query_texts": (("queries",), ""),
    "query_text": (("query",), ""),
    "q": (("query",), ""),
    "text": (("query",), ""),
    # a query's own vector: Qdrant, Pinecone, Chroma
    "query_vector": (("vector",), ""),
    "query_embedding": (("vector",), ""),
    "query_embeddings": (("vectors",), ""),
    "embedding": (("vector",), ""),
    "embeddings": (("vectors",), ""),
    "values": (("vector",), ""),
    # thresholds: Qdrant, LangChain
    "score_threshold": (("min_probability",), "a calibrated probability, 0..1"),
    "min_score": (("min_probability",), "a calibrated probability, 0..1"),
    # what a hit carries: Qdrant, Pinecone, Chroma
    "with_payload": ((), "hits always carry their metadata"),
    "include_metadata": ((), "hits always carry their metadata"),
    "with_vectors": ((), "normcal returns no vectors"),
    "include_values": ((), "normcal returns no vectors"),
    "include": (("include_text",), "metadata is always returned"),
    # a document: LangChain, LlamaIndex, Qdrant, Chroma
    "page_content": (("text",), ""),
    "content": (("text",), ""),
    "document": (("text",), ""),
    "payload": (("metadata",), ""),
    "metadatas": (("metadata",), ""),
    "meta": (("metadata",), ""),
    # paging: Qdrant's scroll
    "offset": (("cursor",), "pass the next_cursor of the previous page"),
    "page": (("cursor",), "pass the next_cursor of the previous page"),
    # where the collection is: Qdrant, Pinecone, Chroma
    "collection_name": ((), _PATH),
    "collection": ((), _PATH),
    "namespace": ((), _PATH),
    # Qdrant's count
    "exact": ((), "counts are always exact"),
}


def hint(request: Request, loc: tuple[Any, ...] | list[Any]) -> str | None:
    """What to send instead of the unknown body field at ``loc``, if it is a habit.

    The field to use is named only when the model refusing the field has it.
    """
    name = str(loc[-1]) if loc else ""
    habit = HABITS.get(name)
    if habit is None or not loc or loc[0] != "body":
        return None
    fields, note = habit
    if not fields:
        return note
    model = _model_at(request, list(loc[1:-1]))
    field = next((f for f in fields if model and f in model.model_fields), None)
    if field is None:
        return None
    advice = f"normcal's field is `{field}`"
    return f"{advice} ({note})" if note else advice


def _model_at(request: Request, path: list[Any]) -> type[BaseModel] | None:
    """The request model at ``path`` (field names, list indices) in the route's body."""
    body = getattr(request.scope.get("route"), "body_field", None)
    annotation = body.field_info.annotation if body is not None else None
    for part in path:
        if isinstance(part, int) or str(part).isdigit():
            annotation = _unwrap(annotation)
            annotation = (
                get_args(annotation)[0] if get_origin(annotation) is list else None
            )
        else:
            model = _model(annotation)
            field = model.model_fields.get(str(part)) if model is not None else None
            annotation = field.annotation if field is not None else None
    return _model(annotation)


def _model(annotation: Any) -> type[BaseModel] | None:
    annotation = _unwrap(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _unwrap(annotation: Any) -> Any:
    """``annotation`` without ``Annotated`` and ``| None``."""
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation = get_args(annotation)[0]
        elif origin in (Union, types.UnionType):
            options = [a for a in get_args(annotation) if a is not type(None)]
            if len(options) != 1:
                return annotation
            annotation = options[0]
        else:
            return annotation
