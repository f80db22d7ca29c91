"""The normcal command line: run the service, ingest documents, fit and evaluate calibrators."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import deque
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from normcal_client import NormcalClient, NormcalError
    from pydantic import ValidationError

    from app.cli.inputs import ColumnKind
    from app.embedding import Embedder, EmbeddingBatch, InputType

DEFAULT_URL = "http://127.0.0.1:8000"

# Exit statuses; each user error is one line on stderr (``normcal: ...``).
EXIT_USAGE = 2  # bad arguments or NORMCAL_* settings
EXIT_INPUT = 3  # a file, folder or split is missing or malformed
EXIT_UNREACHABLE = 4  # no HTTP answer from --url
EXIT_API = 5  # the server answered with a problem (4xx/5xx)
EXIT_BUSY = 6  # another normcal process owns the data dir
EXIT_CANNOT_LISTEN = 7  # serve cannot bind its host:port (in use, or not allowed)
EXIT_INTERRUPTED = 130  # Ctrl-C
# `normcal eval --depth`'s bound: calibration.features.LEXICAL_DEPTH, the BM25 ranks'
# depth (not imported: parsing loads no numpy; tests/cli/test_evaluation.py checks).
MAX_EVAL_DEPTH = 100

EPILOG = f"""\
exit status:
  0    success
  {EXIT_USAGE}    usage: no command, bad arguments or invalid NORMCAL_* settings
  {EXIT_INPUT}    input: a file, folder or qrels split is missing or malformed
  {EXIT_UNREACHABLE}    the server at --url did not answer (is normcal serve running there?)
  {EXIT_API}    the server refused the request (its problem title and detail are printed)
  {EXIT_BUSY}    the data dir is in use by another normcal process (its pid is printed)
  {EXIT_CANNOT_LISTEN}    serve cannot listen on its host:port (another process has it, or not allowed)
  {EXIT_INTERRUPTED}  interrupted (ingest --skip-existing resumes)

environment:
  NORMCAL_URL      server URL of ingest and fit (default {DEFAULT_URL})
  NORMCAL_API_KEY  bearer key sent by ingest and fit
  NORMCAL_*        service settings of serve and eval (see docs/configuration.md)
"""


class CliError(Exception):
    """A user error: printed as one line, the process exits with ``code``."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def _batches(
    items: Iterator[dict[str, Any]], size: int
) -> Iterator[list[dict[str, Any]]]:
    batch: list[dict[str, Any]] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _settings(**overrides: Any) -> Any:
    """``Settings`` from the environment, or a :class:`CliError` naming bad variables."""
    from pydantic import ValidationError

    from app.settings import Settings

    try:
        return Settings(**overrides)
    except ValidationError as error:
        raise CliError(
            EXIT_USAGE, f"invalid settings: {_settings_errors(error)}"
        ) from None


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the HTTP service in this process.

    Invalid settings (say an empty ``NORMCAL_API_KEY``, or a keys file that breaks a
    rule) end it with one line on stderr and exit status 2, before anything loads. The data dir is locked before
    anything opens (:mod:`app.collections.ownership`), with either storage backend
    (the data dir keeps the fit jobs too): a second server on it exits 6 with one
    line naming the holder's pid. An address it cannot bind (another process
    listens there) ends it with one line naming the address and exit status 7.
    """
    from app.api.app import create_app
    from app.api.keys import KeysFileError
    from app.api.serving import CannotListenError, serve
    from app.observability import configure_logging

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    overrides: dict[str, Any] = {}
    if args.data_dir is not None:
        overrides["data_dir"] = args.data_dir
    settings = _settings(**overrides)
    _check_model(settings)
    configure_logging(settings.log_level, settings.log_format)
    try:
        app = create_app(settings)
    except KeysFileError as error:
        raise CliError(
            EXIT_USAGE,
            f"invalid settings: NORMCAL_API_KEYS_FILE {settings.api_keys_file}: {error}",
        ) from None
    with _own_data_dir(Path(settings.data_dir), "serve"):
        try:
            return serve(
                app,
                settings,
                host=settings.host if args.host is None else args.host,
                port=settings.port if args.port is None else args.port,
                port_file=args.port_file,
            )
        except CannotListenError as error:
            raise CliError(EXIT_CANNOT_LISTEN, str(error)) from None


def _check_model(settings: Any) -> None:
    """Stop in one line when the model files are missing or not the model named.

    A missing ``NORMCAL_MODEL_PATH`` (or one without model files) is an input error;
    a ``NORMCAL_MODEL_NAME`` the files contradict (:mod:`app.embedding.known`) an
    invalid setting. Checked before anything loads: the files' configs and identity.
    """
    from app.embedding.identity import model_identity
    from app.embedding.known import contradiction, files_dimension

    path = Path(settings.model_path)
    where = f"NORMCAL_MODEL_PATH {settings.model_path}"
    if not path.is_dir():
        what = "is a file, not a folder" if path.exists() else "no such folder"
        raise CliError(
            EXIT_INPUT,
            f"{where}: {what}; it must be a local sentence-transformers model "
            "folder (unset, it is the bundled all-MiniLM-L6-v2)",
        )
    try:
        model_id = model_identity(path)
    except (OSError, ValueError):
        raise CliError(
            EXIT_INPUT,
            f"{where}: no model files in this folder (config.json, modules.json, "
            "weights); it must be a local sentence-transformers model folder",
        ) from None
    lie = contradiction(
        settings.model_name, model_id, files_dimension(path), settings.model_path
    )
    if lie is not None:
        raise CliError(EXIT_USAGE, f"invalid settings: {lie}")


@contextmanager
def _own_data_dir(data_dir: Path, command: str) -> Iterator[None]:
    """Hold ``data_dir``'s lock for the block; another holder is a :class:`CliError`.

    A data dir that cannot be locked for lack of write access is served unlocked
    (nothing can be written to it: ``/readyz`` reports it and writes get a 503).
    """
    import logging

    from app.collections.ownership import DataDirBusyError, lock_data_dir

    try:
        lock = lock_data_dir(data_dir, command)
    except DataDirBusyError as error:
        raise CliError(
            EXIT_BUSY,
            f"{error}; one server per data dir: stop it, or give this one another "
            "NORMCAL_DATA_DIR",
        ) from None
    except OSError as error:
        logging.getLogger(__name__).warning(
            "cannot lock data dir %s, serving it unlocked: %s", data_dir, error
        )
        yield
        return
    with lock:
        yield


def _settings_errors(error: ValidationError) -> str:
    """One line naming each bad ``NORMCAL_*`` variable and why (never its value)."""
    parts = []
    for item in error.errors(include_input=False):
        name = "NORMCAL_" + "_".join(str(p) for p in item["loc"]).upper()
        parts.append(f"{name}: {item['msg'].removeprefix('Value error, ')}")
    return "; ".join(parts)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _problem_line(error: NormcalError) -> str:
    """The server's problem as one line: status, title, detail, request id."""
    line = f"server refused the request: {error.status} {error.title}: {error.detail}"
    if error.instance:
        line += f" ({error.instance})"
    return _one_line(line)


@contextmanager
def _api(url: str, timeout: float) -> Iterator[NormcalClient]:
    """A client on ``url``; its errors become one-line :class:`CliError` s."""
    from normcal_client import ConnectionFailed, NormcalClient, NormcalError

    try:
        with NormcalClient(
            url, api_key=os.environ.get("NORMCAL_API_KEY"), timeout=timeout
        ) as client:
            yield client
    except ConnectionFailed as error:
        raise CliError(
            EXIT_UNREACHABLE,
            _one_line(
                f"cannot reach the server at {url} ({error.detail}); is normcal "
                "serve running there? (set --url or NORMCAL_URL)"
            ),
        ) from None
    except NormcalError as error:
        raise CliError(EXIT_API, _problem_line(error)) from None


def _input_error(error: Exception) -> CliError:
    return CliError(EXIT_INPUT, _one_line(str(error)))


class Ingested(NamedTuple):
    """What :func:`ingest_documents` did."""

    seconds: float
    skipped: int  # already stored (``skip_existing``), not sent


def ingest_documents(
    client: NormcalClient,
    collection: str,
    docs: list[dict[str, Any]],
    *,
    batch_size: int = 128,
    progress: bool = True,
    skip_existing: bool = False,
) -> Ingested:
    """Upsert ``docs`` in batches, two in flight; creates the collection if needed.

    With ``skip_existing``, documents whose id is already stored are not sent
    again, so an interrupted ingest resumes without embedding everything twice.
    """
    from tqdm import tqdm

    client.create_collection(collection, exist_ok=True)

    def put(batch: list[dict[str, Any]]) -> tuple[int, int]:
        send = batch
        if skip_existing:
            ids = [doc["id"] for doc in batch]
            stored = {doc.id for doc in client.get_documents(collection, ids)}
            send = [doc for doc in batch if doc["id"] not in stored]
        if send:
            client.upsert_documents(collection, send, batch_size=len(send))
        return len(batch), len(batch) - len(send)

    started, skipped = time.perf_counter(), 0
    in_flight: deque[Future[tuple[int, int]]] = deque()
    with (
        tqdm(total=len(docs), unit="doc", file=sys.stderr, disable=not progress) as bar,
        ThreadPoolExecutor(2) as pool,  # two in flight keep the model busy
    ):

        def settle() -> int:
            seen, skip = in_flight.popleft().result()
            bar.update(seen)
            return skip

        try:
            for batch in _batches(iter(docs), batch_size):
                in_flight.append(pool.submit(put, batch))
                if len(in_flight) == 2:
                    skipped += settle()
            while in_flight:
                skipped += settle()
        finally:  # after an error or Ctrl-C no further batch starts
            for future in in_flight:
                future.cancel()
    return Ingested(time.perf_counter() - started, skipped)


def cmd_ingest(args: argparse.Namespace) -> int:
    """Upsert documents (BEIR folder, JSONL or CSV) into a collection via the API."""
    from app.cli.inputs import InputError, read_documents

    empty: list[str] = []
    kinds: list[ColumnKind] = []
    try:
        docs = read_documents(
            args.source,
            args.limit,
            skipped=empty,
            text_columns=args.text_column,
            kinds=kinds,
        )
    except (InputError, OSError) as error:
        raise _input_error(error) from None
    with _api(args.url, timeout=600) as client:
        done = ingest_documents(
            client,
            args.collection,
            docs,
            batch_size=args.batch_size,
            skip_existing=args.skip_existing,
        )
    sent = len(docs) - done.skipped
    rate = sent / done.seconds if done.seconds > 0 else float("inf")
    skipped = f", {done.skipped} already stored were skipped" if done.skipped else ""
    print(
        f"ingested {sent} documents into {args.collection!r}{skipped} "
        f"in {done.seconds:.1f}s ({rate:.1f} docs/s)"
    )
    if empty:
        print(
            f"skipped {_count(len(empty), 'corpus.jsonl row')} with an empty title "
            f"and text (nothing to embed): {_first_ids(empty)}"
        )
    if kinds:
        print(_kinds_line(kinds))
    return 0


def _kinds_line(kinds: list[ColumnKind]) -> str:
    """How the CSV's metadata columns were stored, and what kept a column text."""
    parts = []
    for kind in kinds:
        if kind.held_by is not None:
            line, cell = kind.held_by
            why = f"text: line {line} has {cell!r}, not a number; the others are"
            parts.append(f"{kind.column} ({why})")
        elif kind.forced:
            parts.append(f"{kind.column} (text: --text-column)")
        else:
            parts.append(f"{kind.column} ({kind.kind})")
    return "metadata columns: " + ", ".join(parts)


DECISIVE_OUTCOMES = ("baseline served", "switched", "none at its floor", "applied")
"""Outcomes of a selection rule that changed or qualify the choice: said in full."""


def selection_summary(why: Mapping[str, Any]) -> str:
    """The served map and each rule's outcome, from the JSON of the choice."""
    stage = " + recalibration" if why["recalibrated"] else ""
    rules = "; ".join(f"{r['rule']}: {r['outcome']}" for r in why["rules"])
    return f"{why['chosen']}{stage} ({rules})"


def _count(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun``, plural (``noun`` + s unless given) unless ``n`` is 1."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def _first_ids(ids: list[str], shown: int = 5) -> str:
    """The first ``shown`` ids, quoted, and how many more there are."""
    more = f" and {len(ids) - shown} more" if len(ids) > shown else ""
    return ", ".join(repr(i) for i in ids[:shown]) + more


def _judgments(
    queries: dict[str, str], qrels: dict[str, dict[str, int]], split: str
) -> list[dict[str, Any]]:
    """The split's judgments, keyed by query text as the API takes them.

    Says on stderr why the number of queries the fit reports can be smaller than
    the split's: qrels rows whose query is not in queries.jsonl are dropped, and
    queries with the same text are one query to the server (their judgments merge).
    """
    judged = [q for q in sorted(qrels) if q in queries]
    texts = {queries[q] for q in judged}
    notes = []
    if missing := len(qrels) - len(judged):
        notes.append(f"{missing} not in queries.jsonl (dropped)")
    if merged := len(judged) - len(texts):
        notes.append(
            f"{merged} share their text with another query "
            "(judgments are keyed by text, so they merge)"
        )
    if notes:
        print(
            f"note: {len(qrels)} queries in qrels/{split}.tsv -> {len(texts)} "
            f"distinct query texts: {'; '.join(notes)}",
            file=sys.stderr,
        )
    return [
        {"query": queries[q], "document_id": d, "relevance": r}
        for q in judged
        for d, r in qrels[q].items()
    ]


def cmd_fit(args: argparse.Namespace) -> int:
    """Fit a calibrator on the server from a BEIR split's qrels.

    The fit runs as a fit job whose stages the progress shows; ``--no-wait`` starts
    it and prints its id and URL instead: a long fit then survives the CLI, a
    proxy's timeout or a closed laptop. It says what it fitted on: the file's
    judgments, the stored feedback it included (``--no-feedback`` leaves that out),
    and what it dropped and why.
    """
    from app.cli.inputs import InputError, default_split, read_judged

    split = args.split or default_split(args.data_dir)
    try:
        queries, qrels = read_judged(args.data_dir, split)
    except (InputError, OSError) as error:
        raise _input_error(error) from None
    judgments = _judgments(queries, qrels, split)
    options: dict[str, Any] = {
        "method": args.method,
        "k": args.k,
        "abstain_target": args.abstain_target,
        "allow_reorder": not args.query_side_only,
        "unknown_documents": "skip" if args.skip_unknown else "error",
        "include_feedback": args.feedback,
    }
    with _api(args.url, timeout=3600) as client:
        client.get_collection(args.collection)  # unreachable or unknown: say so now
        job = client.start_fit(args.collection, judgments, **options)
        url = (
            f"{args.url.rstrip('/')}/v1/collections/{args.collection}/fit-jobs/{job.id}"
        )
        if args.no_wait:
            print(f"fit job {job.id} {job.status}: {url}")
            return 0
        job = _follow_fit_job(client, args.collection, job, url)
    if job.calibrator is None:
        failure = job.error
        detail = (
            "no calibrator"
            if failure is None
            else f"{failure.status} {failure.title}: {failure.detail}"
        )
        raise CliError(EXIT_API, _one_line(f"the fit failed: {detail} ({url})"))
    info = job.calibrator
    print(
        f"calibrator {info.id} ({info.method}, active={info.active}) "
        f"on {info.report['n_queries']} queries"
    )
    if info.judgments is not None:
        for line in fitted_on(info.judgments.model_dump(), split, args.collection):
            print(line)
    if info.selection is not None:
        why = info.selection.model_dump()
        print(f"served: {selection_summary(why)}")
        for rule in why["rules"]:
            if rule["outcome"] in DECISIVE_OUTCOMES:
                print(f"  {rule['detail']}")
    print("| method | NLL | Brier | ECE | AUROC |\n|---|---|---|---|---|")
    for name, m in info.cv.items():
        print(f"| {name} | {m.nll:.4f} | {m.brier:.4f} | {m.ece:.4f} | {m.auroc:.3f} |")
    print(f"norm lift: {info.norm_lift.get('reason', '')}")
    return 0


def fitted_on(judged: Mapping[str, int], split: str, collection: str) -> list[str]:
    """What a fit ran on, from its answer's ``judgments``: one line per source."""
    lines = [
        f"fitted on {_count(judged['queries'], 'judged query', 'judged queries')}: "
        f"{_count(judged['sent'], 'judgment')} of qrels/{split}.tsv "
        f"({_count(judged['sent_queries'], 'query', 'queries')})"
    ]
    if judged["feedback"]:
        lines[0] += (
            f" and {_count(judged['feedback'], 'stored feedback judgment')} "
            f"({_count(judged['feedback_queries'], 'query', 'queries')}; the judging page's and "
            "POST .../feedback's: --no-feedback leaves them out)"
        )
    if judged["dropped"]:
        lines.append(
            f"dropped {_count(judged['dropped'], 'judgment')} naming documents "
            f"not in collection {collection!r} (--skip-unknown)"
        )
    return lines


def _follow_fit_job(client: NormcalClient, collection: str, job: Any, url: str) -> Any:
    """Poll a fit job until it ends, its stage shown as it goes (``FitJob``)."""
    from tqdm import tqdm

    started = time.monotonic()
    with tqdm(
        total=job.progress.total, desc="fit: queued", unit="stage", file=sys.stderr
    ) as bar:
        try:
            while job.status in ("queued", "running"):
                time.sleep(0.5)
                job = client.get_fit_job(collection, job.id)
                bar.update(job.progress.done - bar.n)
                bar.set_description(f"fit: {job.progress.stage}", refresh=False)
                bar.set_postfix_str(f"{time.monotonic() - started:.0f}s")  # shows both
        except KeyboardInterrupt:
            print(f"normcal: the fit job goes on on the server: {url}", file=sys.stderr)
            raise
    return job


class _ProgressEmbedder:
    """An embedder that embeds long lists in chunks and shows a progress bar.

    ``normcal eval`` embeds a whole corpus in one call (minutes on a CPU); the
    model library's own bar is off, so this one says how far it got.
    """

    CHUNK = 512

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.model_name = inner.model_name
        self.model_id = inner.model_id
        self.dim = inner.dim
        self.max_seq_length = inner.max_seq_length

    def embed(self, texts: list[str], input_type: InputType) -> EmbeddingBatch:
        """Embed ``texts`` in order, a chunk at a time."""
        import numpy as np
        from tqdm import tqdm

        from app.embedding import EmbeddingBatch

        if len(texts) <= self.CHUNK:
            return self.inner.embed(texts, input_type)
        parts = []
        with tqdm(
            total=len(texts),
            desc=f"embedding {input_type}s",
            unit="text",
            file=sys.stderr,
        ) as bar:
            for start in range(0, len(texts), self.CHUNK):
                part = self.inner.embed(texts[start : start + self.CHUNK], input_type)
                parts.append(part)
                bar.update(len(part))
        return EmbeddingBatch(
            vectors=np.concatenate([p.vectors for p in parts]),
            norms=np.concatenate([p.norms for p in parts]),
            n_tokens=np.concatenate([p.n_tokens for p in parts]),
            truncated=np.concatenate([p.truncated for p in parts]),
        )


def cmd_eval(args: argparse.Namespace) -> int:
    """Evaluate retrieval and calibration on a BEIR-layout folder (``normcal eval``).

    Locally (embed the corpus, retrieve, evaluate) or, with ``--collection``, on what
    the server at ``--url`` serves for that collection (nothing embedded here; the
    served calibrator scored beside what a fit would give).
    """
    import json

    from app.cli.inputs import InputError, check_beir_split, default_split

    if args.url is not None and args.collection is None:  # not an hour's local run
        raise CliError(
            EXIT_USAGE,
            "--url evaluates a served collection: name it with --collection C "
            "(the collection ingested from DATA_DIR); without both, eval runs locally",
        )
    if not args.k <= args.depth <= MAX_EVAL_DEPTH:
        raise CliError(
            EXIT_USAGE,
            f"--depth must be from --k ({args.k}) to {MAX_EVAL_DEPTH}; "
            f"got {args.depth}",
        )
    split = args.split or default_split(args.data_dir, exclude=args.fit_split)
    splits = [split] + ([args.fit_split] if args.fit_split else [])
    try:  # before anything heavy loads: a typo fails in a second, not a minute
        check_beir_split(args.data_dir, *splits, corpus=True)
    except InputError as error:
        raise _input_error(error) from None

    from app.cli.evaluation import method_table, run_eval
    from app.cli.served import REPRODUCED, ServedEvalError, run_served_eval
    from calibration import CalibrationError
    from calibration.evaluation import EvalOptions

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    options = EvalOptions(
        k=args.k,
        depth=args.depth,
        n_splits=args.folds,
        few_label_sizes=tuple(args.few_label),
        few_label_draws=args.draws,
        query_side=not args.no_query_side,
        seed=args.seed,
    )
    started = time.perf_counter()

    def progress(message: str) -> None:
        elapsed = time.perf_counter() - started
        print(f"[{elapsed:7.1f}s] {message}", file=sys.stderr, flush=True)

    try:
        if args.collection is not None:
            url = args.url or os.environ.get("NORMCAL_URL", DEFAULT_URL)
            with _api(url, timeout=600) as client:
                result = run_served_eval(
                    client,
                    args.collection,
                    args.data_dir,
                    split=split,
                    fit_split=args.fit_split,
                    options=options,
                    progress=progress,
                )
        else:
            from app.api.lifespan import load_embedder

            settings = _settings()
            _check_model(settings)
            result = run_eval(
                _ProgressEmbedder(load_embedder(settings)),
                args.data_dir,
                split=split,
                fit_split=args.fit_split,
                cache_dir=args.cache_dir,
                options=options,
                progress=progress,
            )
    except ServedEvalError as error:
        raise CliError(EXIT_INPUT, _one_line(str(error))) from None
    except (OSError, json.JSONDecodeError, CalibrationError) as error:
        raise _input_error(error) from None
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    reproduced = (result.get("served") or {}).get("reproduced", 0.0)
    if reproduced > REPRODUCED:
        print(
            f"normcal: warning: the served probabilities differ from these lists' by "
            f"up to {reproduced:.3g}: collection {args.collection!r} is not "
            f"{args.data_dir.name}'s corpus alone (its BM25 statistics differ), so the "
            "lexical evidence here is approximate",
            file=sys.stderr,
        )
    print(method_table(result))
    return 0


def cmd_export_onnx(args: argparse.Namespace) -> int:
    """Export the configured model's transformer to ONNX (needs torch and onnx).

    An image ships the result and sets ``NORMCAL_ONNX_PATH`` to it, so the onnx
    backend starts without exporting (and without torch).
    """
    from app.embedding.base import MissingDependencyError
    from app.embedding.onnx_export import export_onnx

    settings = _settings()
    _check_model(settings)
    try:
        out = export_onnx(settings.model_path, args.out)
    except MissingDependencyError as error:
        raise CliError(EXIT_USAGE, str(error)) from None
    print(f"exported {settings.model_path} to {out}; set NORMCAL_ONNX_PATH={out}")
    return 0


def _local_storage_only(command: str, settings: Any) -> None:
    """Refuse a command that works on local collection files under another backend.

    With ``NORMCAL_STORAGE=milvus`` the collections live in Milvus: acting on the
    data dir would change files no server reads, and say it succeeded.
    """
    if settings.storage != "local":
        raise CliError(
            EXIT_USAGE,
            f"{command} works on local collection files, but NORMCAL_STORAGE="
            f"{settings.storage} keeps collections in Milvus at "
            f"{settings.milvus_uri}; back up and restore them with milvus-backup "
            "(https://github.com/zilliztech/milvus-backup) instead",
        )


def cmd_restore(args: argparse.Namespace) -> int:
    """Install a snapshot file as a collection, offline (the server must be stopped).

    The running server restores through ``POST .../snapshots/{id}/restore`` instead:
    it must reopen the collection, which a file swapped under it would not do. Local
    storage only: Milvus collections are backed up with Milvus's own tools.
    """
    from app.collections.ownership import DataDirBusyError
    from app.collections.registry import restore_offline
    from app.exceptions import InvalidRequestError, NormcalError

    settings = _settings()
    _local_storage_only("restore", settings)
    data_dir = args.data_dir if args.data_dir is not None else settings.data_dir
    if not args.snapshot.is_file():
        raise CliError(EXIT_INPUT, f"{args.snapshot}: no such snapshot file")
    try:
        restore_offline(Path(data_dir), args.collection, args.snapshot)
    except DataDirBusyError as error:
        raise CliError(
            EXIT_BUSY,
            f"{error}; restore through the running server instead (POST "
            f"/v1/collections/{args.collection}/snapshots/{{id}}/restore), or "
            "stop it to install this file offline",
        ) from None
    except InvalidRequestError as error:
        code = EXIT_USAGE if error.field == "name" else EXIT_INPUT
        raise CliError(code, _one_line(error.detail)) from None
    except NormcalError as error:
        raise CliError(EXIT_INPUT, _one_line(error.detail)) from None
    except OSError as error:
        raise _input_error(error) from None
    print(f"restored collection {args.collection!r} from {args.snapshot}")
    return 0


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The epilog as written, and every option's default after its help."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (
            not action.option_strings
            or "default:" in text
            or default is None
            or default is argparse.SUPPRESS
        ):
            return text
        if default is False:
            shown = "off"
        elif isinstance(default, list):
            shown = " ".join(str(d) for d in default)
        else:
            shown = "%(default)s"
        return f"{text} (default: {shown})" if text else f"default: {shown}"


def _url(value: str) -> str:
    if not value.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(f"{value!r} is not an http:// or https:// URL")
    return value.rstrip("/")


def _positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a positive integer")
    return number


def _add_url(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        type=_url,
        default=os.environ.get("NORMCAL_URL", DEFAULT_URL),
        help="server URL; NORMCAL_URL sets the default",
    )


if TYPE_CHECKING:
    Subcommands = argparse._SubParsersAction[argparse.ArgumentParser]


def _command(sub: Subcommands, name: str, text: str) -> argparse.ArgumentParser:
    """A subcommand of ``normcal``: its help line, description and epilog."""
    return sub.add_parser(
        name,
        help=text,
        description=text[0].upper() + text[1:] + ".",
        epilog=EPILOG,
        formatter_class=_HelpFormatter,
    )


def add_serve(sub: Subcommands) -> None:
    """``normcal serve``: run the HTTP service."""
    serve = _command(sub, "serve", "run the HTTP service")
    serve.add_argument(
        "--host",
        default=None,
        help="address to bind (default: NORMCAL_HOST, 127.0.0.1)",
    )
    serve.add_argument(
        "--port",
        type=int,
        default=None,
        help="port to bind, 0 for any free one (default: NORMCAL_PORT, 8000)",
    )
    serve.add_argument(
        "--port-file",
        type=Path,
        default=None,
        help="write the bound port to this file once listening (default: none)",
    )
    serve.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="where collections live (default: NORMCAL_DATA_DIR, ./data)",
    )
    serve.set_defaults(func=cmd_serve)


def add_ingest(sub: Subcommands) -> None:
    """``normcal ingest``: upsert documents into a collection via the API."""
    ingest = _command(sub, "ingest", "upsert documents into a collection via the API")
    ingest.add_argument(
        "source",
        type=Path,
        help="a BEIR folder (corpus.jsonl), a JSONL file with one "
        '{"id", "text", "metadata"} object a line, or a CSV file with id and text '
        "columns (other columns become metadata: a column whose every cell is a "
        "number becomes numbers, true/false booleans, any other text)",
    )
    ingest.add_argument("--collection", required=True, help="created if missing")
    _add_url(ingest)
    ingest.add_argument(
        "--batch-size", type=_positive, default=128, help="documents per request"
    )
    ingest.add_argument(
        "--limit",
        type=_positive,
        default=None,
        help="ingest only the first N documents (default: all)",
    )
    ingest.add_argument(
        "--skip-existing",
        action="store_true",
        help="do not resend documents whose id is already stored "
        "(resume an interrupted ingest)",
    )
    ingest.add_argument(
        "--text-column",
        action="extend",
        type=lambda value: [c for c in value.split(",") if c],
        default=[],
        metavar="COLUMN[,COLUMN]",
        help="CSV: keep these metadata columns text even when every cell is a "
        "number or true/false (ids, codes); repeatable",
    )
    ingest.set_defaults(func=cmd_ingest)


def add_fit(sub: Subcommands) -> None:
    """``normcal fit``: fit a calibrator on the server from qrels."""
    fit = _command(
        sub, "fit", "fit a calibrator on the server from a BEIR split's qrels"
    )
    fit.add_argument(
        "data_dir", type=Path, help="BEIR folder with queries.jsonl and qrels/"
    )
    fit.add_argument("--collection", required=True, help="the collection to calibrate")
    fit.add_argument(
        "--split",
        default=None,
        help="qrels split (qrels/SPLIT.tsv); default: train, or test when the set "
        "has no train split",
    )
    fit.add_argument(
        "--method",
        default="auto",
        choices=["auto", "platt", "isotonic", "nt", "nt-list"],
        help="calibration method; auto picks by cross-validation",
    )
    fit.add_argument(
        "--k", type=_positive, default=20, help="retrieval depth of the pairs"
    )
    fit.add_argument(
        "--abstain-target",
        type=float,
        default=0.1,
        help="tolerated share of answered queries (abstain false) that have no "
        "relevant hit in the top k; the abstain threshold is certified for it "
        "when enough queries are judged (a few dozen)",
    )
    fit.add_argument(
        "--feedback",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also fit on the judgments stored as feedback (the judging page's, "
        "POST .../feedback's); --no-feedback fits on the file's alone",
    )
    fit.add_argument(
        "--query-side-only",
        action="store_true",
        help="only query-side terms (allow_reorder: false): probabilities stay "
        "monotone in cosine within a query, at the cost of BM25 evidence",
    )
    fit.add_argument(
        "--skip-unknown",
        action="store_true",
        help="leave out judgments naming documents the collection does not hold "
        "(say, empty ones ingest skipped) and say how many, instead of refusing",
    )
    fit.add_argument(
        "--no-wait",
        action="store_true",
        help="start the fit job and print its id and URL, without waiting for it "
        "(GET the URL for its progress and calibrator)",
    )
    _add_url(fit)
    fit.set_defaults(func=cmd_fit)


def add_eval(sub: Subcommands) -> None:
    """``normcal eval``: metrics on a BEIR folder, locally."""
    ev = _command(
        sub,
        "eval",
        "retrieval and calibration metrics on a BEIR folder (locally, or of a "
        "served collection)",
    )
    ev.add_argument(
        "data_dir", type=Path, help="BEIR folder (corpus.jsonl, queries.jsonl, qrels/)"
    )
    ev.add_argument(
        "--split",
        default=None,
        help="qrels split to evaluate on; default: train, or test when the set has "
        "no train split (or train is --fit-split)",
    )
    ev.add_argument(
        "--fit-split",
        default=None,
        help="fit on this qrels split and evaluate on --split "
        "(default: nested cross-validation on --split)",
    )
    ev.add_argument(
        "--k", type=_positive, default=20, help="top-k hits per query as pairs"
    )
    ev.add_argument(
        "--depth",
        type=_positive,
        default=100,
        help="depth of the dense and BM25 lists whose hybrid pool every retrieval "
        f"mode reorders, from --k to {MAX_EVAL_DEPTH} (a search's pool is 20 + 20 "
        "unless it asks for more candidates)",
    )
    ev.add_argument("--folds", type=_positive, default=5, help="grouped CV folds")
    ev.add_argument(
        "--few-label",
        type=_positive,
        nargs="+",
        default=[5, 10, 30, 100],
        metavar="N",
        help="labelled-query counts of the few-label curve",
    )
    ev.add_argument(
        "--draws", type=_positive, default=5, help="random draws per few-label N"
    )
    ev.add_argument(
        "--no-query-side",
        action="store_true",
        help="skip the auto/query-side row (the allow_reorder: false fit)",
    )
    ev.add_argument("--seed", type=int, default=0, help="seed of folds and draws")
    ev.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(".normcal-cache"),
        help="corpus embeddings are cached here per model and corpus file",
    )
    ev.add_argument(
        "--collection",
        default=None,
        help="evaluate this served collection, ingested from DATA_DIR, over HTTP "
        "(--url): nothing is embedded here, and the calibrator it serves is scored "
        "beside what a fit would give (default: embed DATA_DIR locally)",
    )
    ev.add_argument(
        "--url",
        type=_url,
        default=None,
        help="with --collection: the server's URL (default NORMCAL_URL, else "
        f"{DEFAULT_URL})",
    )
    ev.add_argument(
        "--json",
        type=Path,
        default=None,
        help="also write the report here (default: no)",
    )
    ev.set_defaults(func=cmd_eval)


def add_restore(sub: Subcommands) -> None:
    """``normcal restore``: install a snapshot file as a collection."""
    restore = _command(
        sub, "restore", "install a snapshot file as a collection (server stopped)"
    )
    restore.add_argument(
        "snapshot", type=Path, help="a snapshot file (GET .../snapshots/{id})"
    )
    restore.add_argument(
        "--collection",
        required=True,
        help="the collection it replaces (created if missing); must be the "
        "collection the snapshot was taken of",
    )
    restore.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="where collections live (default: NORMCAL_DATA_DIR, ./data)",
    )
    restore.set_defaults(func=cmd_restore)


def add_export_onnx(sub: Subcommands) -> None:
    """``normcal export-onnx``: export the model to ONNX."""
    export = _command(
        sub,
        "export-onnx",
        "export the model (NORMCAL_MODEL_PATH) to ONNX for the onnx backend",
    )
    export.add_argument(
        "--out",
        type=Path,
        required=True,
        help="directory for model.onnx and manifest.json (then NORMCAL_ONNX_PATH=DIR)",
    )
    export.set_defaults(func=cmd_export_onnx)


# The subcommands, in the order ``normcal --help`` lists them.
COMMANDS = (add_serve, add_ingest, add_fit, add_eval, add_restore, add_export_onnx)


def version_line() -> str:
    """``normcal --version``: the version, the Python and the configured model."""
    import platform

    from pydantic import ValidationError

    from app import __version__
    from app.settings import Settings

    try:
        model = Settings().model_name
    except ValidationError:
        model = "unknown (invalid NORMCAL_* settings)"
    return f"normcal {__version__} (python {platform.python_version()}, model {model})"


class _VersionAction(argparse.Action):
    """``--version``: print :func:`version_line` and exit 0 (built only when asked)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        kwargs.setdefault("help", "print the version, the Python and the model; exit")
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(version_line())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``normcal``: one ``add_<command>`` per subcommand."""
    parser = argparse.ArgumentParser(
        prog="normcal",
        description=__doc__,
        epilog=EPILOG,
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("--version", action=_VersionAction, default=argparse.SUPPRESS)
    # Not required: with no command, main() prints this help rather than one line.
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``normcal`` script: user errors are one line and a code.

    With no command, the help (every command and exit status) goes to stdout and
    the status is 2, a usage error: a script calling ``normcal $EMPTY`` fails.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(args.func(args))
    except CliError as error:
        print(f"normcal: {error}", file=sys.stderr)
        return error.code
    except KeyboardInterrupt:
        hint = (
            " (rerun with --skip-existing to resume)"
            if args.command == "ingest"
            else ""
        )
        print(f"normcal: interrupted{hint}", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
