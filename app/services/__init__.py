"""The service's use cases, independent of HTTP, one module per resource.

Routers translate HTTP into calls on ``Service`` and touch nothing else: not the
embedder, the registry or the pool. A router calls its resource's part
(``service.documents.upsert``); the parts share one ``Context`` (``context.py``). The
service reaches collections only through the methods of ``CollectionBackend`` and
``Registry`` (``app.collections.base``), never their store, so it serves either
backend. Every CPU-bound step runs in the bounded pool.
"""

from __future__ import annotations

from app.services.calibrators import CalibratorsService
from app.services.collections import CollectionsService
from app.services.context import NO_DEFAULT_REASON, Context
from app.services.documents import DocumentsService
from app.services.judging import JudgingService
from app.services.rerank import RerankService
from app.services.search import SearchService
from app.services.system import SystemService


class Service:
    """Every part of the service over one context, owned by the app's lifespan."""

    def __init__(self, context: Context) -> None:
        self.context = context
        self.system = SystemService(context)
        self.collections = CollectionsService(context)
        self.documents = DocumentsService(context)
        self.search = SearchService(context)
        self.rerank = RerankService(context)
        self.calibrators = CalibratorsService(context)
        self.judging = JudgingService(context)


__all__ = ["NO_DEFAULT_REASON", "Context", "Service"]
