"""The service itself, not a collection: readiness, version, metrics, embedding."""

from __future__ import annotations

from app import __version__
from app.embedding import InputType
from app.embedding.precision import precision_of
from app.exceptions import NotFoundError, StorageUnavailableError
from app.profiles import shipped_profiles
from app.schemas.embed import Embedding, EmbedResponse
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
    """``/readyz``, ``/version``, ``/metrics`` and ``/v1/embed``."""

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
