"""The ``normcal`` command line: ``serve``, ``ingest`` (and more as the product grows)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from normcal_client import NormcalClient, NormcalError
    from pydantic import ValidationError

DEFAULT_URL = "http://127.0.0.1:8000"


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


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the HTTP service in this process.

    Invalid settings (say an empty ``NORMCAL_API_KEY``) end it with one line on
    stderr and exit status 2, before anything loads.
    """
    from pydantic import ValidationError

    from app.api.app import create_app
    from app.api.serving import serve
    from app.ops.observability import configure_logging
    from app.settings import Settings

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    overrides: dict[str, Any] = {}
    if args.data_dir is not None:
        overrides["data_dir"] = args.data_dir
    try:
        settings = Settings(**overrides)
    except ValidationError as error:
        print(f"normcal: invalid settings: {_settings_errors(error)}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, json_lines=settings.log_format == "json")
    return serve(
        create_app(settings),
        settings,
        host=settings.host if args.host is None else args.host,
        port=settings.port if args.port is None else args.port,
        port_file=args.port_file,
    )


def _settings_errors(error: ValidationError) -> str:
    """One line naming each bad ``NORMCAL_*`` variable and why (never its value)."""
    parts = []
    for item in error.errors(include_input=False):
        name = "NORMCAL_" + "_".join(str(p) for p in item["loc"]).upper()
        parts.append(f"{name}: {item['msg'].removeprefix('Value error, ')}")
    return "; ".join(parts)


def _client(url: str, timeout: float) -> NormcalClient:
    from normcal_client import NormcalClient

    return NormcalClient(
        url, api_key=os.environ.get("NORMCAL_API_KEY"), timeout=timeout
    )


def _fail(error: NormcalError) -> int:
    """One line on stderr for an error the server (or the network) reported."""
    print(f"normcal: {error}", file=sys.stderr)
    return 1


def ingest_documents(
    client: NormcalClient,
    collection: str,
    docs: list[dict[str, Any]],
    *,
    batch_size: int = 128,
    progress: bool = True,
) -> float:
    """Upsert ``docs`` in batches (two in flight) and return the elapsed seconds.

    Creates the collection when it does not exist yet.
    """
    from tqdm import tqdm

    client.create_collection(collection, exist_ok=True)

    def put(batch: list[dict[str, Any]]) -> int:
        client.upsert_documents(collection, batch, batch_size=len(batch))
        return len(batch)

    started = time.perf_counter()
    with (
        tqdm(total=len(docs), unit="doc", file=sys.stderr, disable=not progress) as bar,
        ThreadPoolExecutor(2) as pool,  # two in flight keep the model busy
    ):
        for n in pool.map(put, _batches(iter(docs), batch_size)):
            bar.update(n)
    return time.perf_counter() - started


def cmd_ingest(args: argparse.Namespace) -> int:
    """Upsert a BEIR corpus into a collection through the HTTP API."""
    from normcal_client import NormcalError

    from app.ops.beir import read_corpus

    docs = list(read_corpus(Path(args.data_dir), args.limit))
    with _client(args.url, timeout=600) as client:
        try:
            elapsed = ingest_documents(
                client, args.collection, docs, batch_size=args.batch_size
            )
        except NormcalError as error:
            return _fail(error)
    rate = len(docs) / elapsed if elapsed > 0 else float("inf")
    print(
        f"ingested {len(docs)} documents into {args.collection!r} "
        f"in {elapsed:.1f}s ({rate:.1f} docs/s)"
    )
    return 0


def cmd_fit(args: argparse.Namespace) -> int:
    """Fit a calibrator on the server from a BEIR split's qrels."""
    from normcal_client import NormcalError
    from tqdm import tqdm

    from app.ops.beir import read_qrels, read_queries

    data_dir = Path(args.data_dir)
    queries = read_queries(data_dir)
    qrels = read_qrels(data_dir, args.split)
    judgments = [
        {"query": queries[q], "document_id": d, "relevance": r}
        for q, docs in sorted(qrels.items())
        if q in queries
        for d, r in docs.items()
    ]
    with (
        _client(args.url, timeout=3600) as client,
        ThreadPoolExecutor(1) as pool,
        tqdm(desc=f"fitting on {len(qrels)} queries", unit="s", file=sys.stderr) as bar,
    ):
        future = pool.submit(
            client.fit_calibrator,
            args.collection,
            judgments,
            method=args.method,
            k=args.k,
            abstain_target=args.abstain_target,
            allow_reorder=args.allow_reorder,
        )
        while not future.done():  # the fit is one request: show that it is alive
            time.sleep(1.0)
            bar.update(1)
        try:
            info = future.result()
        except NormcalError as error:
            return _fail(error)
    print(
        f"calibrator {info.id} ({info.method}, active={info.active}) "
        f"on {info.report['n_queries']} queries"
    )
    print("| method | NLL | Brier | ECE | AUROC |\n|---|---|---|---|---|")
    for name, m in info.cv.items():
        print(f"| {name} | {m.nll:.4f} | {m.brier:.4f} | {m.ece:.4f} | {m.auroc:.3f} |")
    print(f"norm lift: {info.norm_lift.get('reason', '')}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    """Evaluate retrieval and calibration on a BEIR-layout folder (``normcal eval``)."""
    import json

    from app.api.lifespan import load_embedder
    from app.ops.evaluation import method_table, run_eval
    from app.settings import Settings
    from calibration import CalibrationError
    from calibration.evaluation import EvalOptions

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    options = EvalOptions(
        k=args.k,
        n_splits=args.folds,
        few_label_sizes=tuple(args.few_label),
        few_label_draws=args.draws,
        reorder=not args.no_reorder,
        seed=args.seed,
    )
    started = time.perf_counter()

    def progress(message: str) -> None:
        elapsed = time.perf_counter() - started
        print(f"[{elapsed:7.1f}s] {message}", file=sys.stderr, flush=True)

    try:
        result = run_eval(
            load_embedder(Settings()),
            Path(args.data_dir),
            split=args.split,
            fit_split=args.fit_split,
            cache_dir=args.cache_dir,
            options=options,
            progress=progress,
        )
    except (OSError, CalibrationError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(method_table(result))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``normcal``."""
    parser = argparse.ArgumentParser(prog="normcal", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the HTTP service")
    serve.add_argument("--host", default=None, help="default: NORMCAL_HOST, 127.0.0.1")
    serve.add_argument(
        "--port", type=int, default=None, help="default: NORMCAL_PORT, 8000; 0: any"
    )
    serve.add_argument(
        "--port-file",
        type=Path,
        default=None,
        help="write the bound port here once the socket is bound (for --port 0)",
    )
    serve.add_argument(
        "--data-dir", type=Path, default=None, help="overrides NORMCAL_DATA_DIR"
    )
    serve.set_defaults(func=cmd_serve)

    ingest = sub.add_parser("ingest", help="upsert a BEIR corpus.jsonl via the API")
    ingest.add_argument("data_dir", type=Path, help="folder holding corpus.jsonl")
    ingest.add_argument("--collection", required=True)
    ingest.add_argument("--url", default=os.environ.get("NORMCAL_URL", DEFAULT_URL))
    ingest.add_argument("--batch-size", type=int, default=128)
    ingest.add_argument(
        "--limit", type=int, default=None, help="first N documents only"
    )
    ingest.set_defaults(func=cmd_ingest)

    fit = sub.add_parser("fit", help="fit a calibrator from BEIR qrels via the API")
    fit.add_argument("data_dir", type=Path, help="BEIR folder with queries and qrels")
    fit.add_argument("--collection", required=True)
    fit.add_argument("--split", default="train")
    fit.add_argument(
        "--method",
        default="auto",
        choices=["auto", "platt", "isotonic", "nt", "nt-list"],
    )
    fit.add_argument("--k", type=int, default=20, help="retrieval depth of the pairs")
    fit.add_argument("--abstain-target", type=float, default=0.1)
    fit.add_argument("--allow-reorder", action="store_true")
    fit.add_argument("--url", default=os.environ.get("NORMCAL_URL", DEFAULT_URL))
    fit.set_defaults(func=cmd_fit)

    ev = sub.add_parser(
        "eval", help="retrieval and calibration metrics on a BEIR folder with qrels"
    )
    ev.add_argument("data_dir", type=Path, help="BEIR folder (corpus, queries, qrels)")
    ev.add_argument("--split", default="test", help="qrels split to evaluate on")
    ev.add_argument(
        "--fit-split",
        default=None,
        help="fit on this qrels split and evaluate on --split (default: nested CV)",
    )
    ev.add_argument("--k", type=int, default=20, help="top-k hits per query as pairs")
    ev.add_argument("--folds", type=int, default=5, help="grouped CV folds")
    ev.add_argument(
        "--few-label", type=int, nargs="+", default=[5, 10, 30, 100], metavar="N"
    )
    ev.add_argument("--draws", type=int, default=5, help="random draws per few-label N")
    ev.add_argument(
        "--no-reorder", action="store_true", help="skip the auto+reorder row"
    )
    ev.add_argument("--seed", type=int, default=0)
    ev.add_argument("--cache-dir", type=Path, default=Path(".normcal-cache"))
    ev.add_argument("--json", type=Path, default=None, help="write the report here")
    ev.set_defaults(func=cmd_eval)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``normcal`` script."""
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
