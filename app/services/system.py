"""The service itself, not a collection: readiness, version, metrics, embedding."""

from __future__ import annotations

import base64

import numpy as np

from app import __version__
from app.embedding import InputType
from app.embedding.precision import precision_of
from app.exceptions import (
    InvalidRequestError,
    NotFoundError,
    StorageUnavailableError,
)
from app.profiles import shipped_profiles
from app.schemas.embed import (
    Embedding,
    EmbeddingsItem,
    EmbeddingsRequest,
    EmbeddingsResponse,
    EmbeddingsUsage,
    EmbedResponse,
)
from app.schemas.health import (
    EmbeddingInfo,
    ModelIdentity,
    Readiness,
    ShippedProfileInfo,
    UnavailableCollection,
    VersionInfo,
)
from app.services import limits
from app.services.context import Part


class SystemService(Part):
    """``/readyz``, ``/version``, ``/metrics``, ``/v1/embed`` and ``/v1/embeddings``."""

    # -- health -----------------------------------------------------------------------
    def readiness(self, *, detailed: bool) -> Readiness:
        """Whether the service can take writes; ``status`` is ``"not ready"`` if not.

        Not ready also while the storage loads collections (Milvus after a restart):
        ready means every collection can answer. ``degraded`` when some collections
        are quarantined or fit jobs cannot be recorded (a damaged ``_jobs.sqlite3``):
        the rest is served. Only a ``detailed`` answer (for a caller holding the API
        key, or when there is none) counts and names collections and says which path
        is unwritable.
        """
        storage = self.registry.storage_problem()
        broken = self.registry.unavailable()
        loading = [] if storage else self.registry.loading()
        reasons: list[str] = []
        if storage is not None:
            reasons.append(
                storage
                if detailed
                else "the data dir is not writable"
                if self.registry.backend == "local"
                else f"the {self.registry.backend} storage does not answer"
            )
        if loading:
            reasons.append(f"{len(loading)} collection(s) still loading")
        if broken:
            reasons.append(f"{len(broken)} collection(s) unavailable")
        jobs = self.fit_jobs.problem()
        if jobs is not None:  # searches and writes are served; fits are not
            reasons.append(jobs if detailed else "fit jobs unavailable")
        degraded = "degraded" if broken or jobs else "ready"
        status = "not ready" if storage or loading else degraded
        answer = Readiness(
            status=status,
            model=self.embedder.model_name,
            dim=self.embedder.dim,
            reasons=reasons,
        )
        if detailed:
            try:
                answer.collections = len(self.registry.names())
            except StorageUnavailableError:  # Milvus does not answer: no count
                pass
            answer.unavailable = [
                UnavailableCollection(name=u.name, reason=u.reason) for u in broken
            ]
            answer.loading = loading
            answer.embedding = self.embedding_info()
        return answer

    def embedding_info(self) -> EmbeddingInfo:
        """The backend, the precision in use and why, the threads per pass."""
        choice = precision_of(self.embedder)
        return EmbeddingInfo(
            backend=self.settings.embedding_backend,
            precision=choice.precision,
            reason=choice.reason,
            threads=self.settings.embed_threads,
        )

    def version(self) -> VersionInfo:
        """The normcal version, the serving model's identity, the shipped profiles."""
        return VersionInfo(
            normcal=__version__,
            model=ModelIdentity(
                name=self.embedder.model_name,
                id=self.embedder.model_id,
                path=self.settings.model_path,
            ),
            embedding=self.embedding_info(),
            profiles=[
                ShippedProfileInfo(name=p.name, format=p.format, model_id=p.model_id)
                for p in shipped_profiles()
            ],
        )

    def render_metrics(self) -> bytes:
        """The Prometheus exposition (404 when the app was built without metrics)."""
        if self.metrics is None:
            raise NotFoundError("endpoint", "/metrics")
        return self.metrics.render()

    # -- embedding --------------------------------------------------------------------
    async def embed(self, texts: list[str], input_type: InputType) -> EmbedResponse:
        """Embed texts after checking the batch and text limits."""
        lim = self.settings.limits
        limits.check_count("texts", texts, lim.max_texts_per_request)
        limits.check_texts("texts", texts, lim)
        batch = await self.batcher.embed(texts, input_type)
        return EmbedResponse(
            data=[
                Embedding(
                    embedding=batch.vectors[i].tolist(),
                    norm=float(batch.norms[i]),
                    n_tokens=int(batch.n_tokens[i]),
                    truncated=bool(batch.truncated[i]),
                )
                for i in range(len(batch))
            ],
            model=self.embedder.model_name,
            dim=self.embedder.dim,
        )

    async def embeddings(self, request: EmbeddingsRequest) -> EmbeddingsResponse:
        """``/v1/embeddings``: OpenAI's shape, the same limits as ``/v1/embed``."""
        self._check_model(request.model)
        if request.dimensions is not None and request.dimensions != self.embedder.dim:
            raise InvalidRequestError(
                f"dimensions: this model's embeddings have {self.embedder.dim} "
                f"dimensions, not {request.dimensions} (they cannot be shortened)",
                field="dimensions",
            )
        texts = request.input  # one text arrives as a list of one
        lim = self.settings.limits
        limits.check_count("input", texts, lim.max_texts_per_request)
        limits.check_texts("input", texts, lim)
        batch = await self.batcher.embed(texts, request.input_type)
        tokens = int(batch.n_tokens.sum())
        return EmbeddingsResponse(
            data=[
                EmbeddingsItem(
                    embedding=_encoded(batch.vectors[i], request.encoding_format),
                    index=i,
                    norm=float(batch.norms[i]),
                    truncated=bool(batch.truncated[i]),
                )
                for i in range(len(batch))
            ],
            model=self.embedder.model_name,
            usage=EmbeddingsUsage(prompt_tokens=tokens, total_tokens=tokens),
        )

    def _check_model(self, model: str | None) -> None:
        """Refuse another model's name: its caller expects that model's vectors."""
        name = self.embedder.model_name
        if model is None or model in {name, name.rsplit("/", 1)[-1]}:
            return
        if model == self.embedder.model_id:
            return
        raise InvalidRequestError(
            f"model: {model!r} is not served here; this service embeds with "
            f"{name!r} ({self.embedder.model_id}): send that name, or no model",
            field="model",
        )


def _encoded(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    """The vector as numbers, or as base64 of its little-endian float32 bytes."""
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    values: list[float] = vector.tolist()
    return values
