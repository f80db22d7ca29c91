"""The judging loop: the opt-in query log, the queue of queries to judge, the next one.

Judgments themselves go to ``POST /v1/collections/{name}/feedback``.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response, status

from app.api.auth import ADMIN, JUDGE, READ
from app.api.deps import ServiceDep
from app.api.errors import PROBLEM_RESPONSES
from app.api.routers.params import CollectionName
from app.schemas.judging import (
    JudgingNext,
    JudgingQueriesRequest,
    JudgingQueriesResponse,
    QueryLogInfo,
    QueryLogSettings,
    SkipRequest,
)

DEFAULT_JUDGING_K = 10

router = APIRouter(
    prefix="/collections/{name}", tags=["judging"], responses=PROBLEM_RESPONSES
)


@router.get("/query-log", dependencies=[READ])
def read_query_log(*, name: CollectionName, service: ServiceDep) -> QueryLogInfo:
    """Whether searches are logged, the retention, and how many queries are kept."""
    return service.judging.query_log(name)


@router.put("/query-log", dependencies=[ADMIN])
def update_query_log(
    *, name: CollectionName, body: QueryLogSettings, service: ServiceDep
) -> QueryLogInfo:
    """Turn the query log on or off and set its retention (the oldest are dropped)."""
    return service.judging.set_query_log(name, body)


@router.post(
    "/judging/queries", dependencies=[JUDGE], status_code=status.HTTP_201_CREATED
)
def create_judging_queries(
    *, name: CollectionName, body: JudgingQueriesRequest, service: ServiceDep
) -> JudgingQueriesResponse:
    """Queue queries to judge; they are offered before any logged query."""
    return JudgingQueriesResponse(
        added=service.judging.add_judging_queries(name, body.queries)
    )


@router.get("/judging/next", dependencies=[JUDGE])
async def read_next_to_judge(
    *,
    name: CollectionName,
    service: ServiceDep,
    k: Annotated[int, Query(ge=1, description="hits shown; at most max_k")] = (
        DEFAULT_JUDGING_K
    ),
) -> JudgingNext:
    """The next query to judge, its top hits, and the progress towards a fit."""
    return await service.judging.next_to_judge(name, k)


@router.post(
    "/judging/skip", dependencies=[JUDGE], status_code=status.HTTP_204_NO_CONTENT
)
def create_skip(
    *, name: CollectionName, body: SkipRequest, service: ServiceDep
) -> Response:
    """Never offer this queued or logged query again."""
    service.judging.skip_judging(name, body.query)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
