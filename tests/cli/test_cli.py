"""The ``normcal`` CLI against a real server on loopback.

User errors are asserted from a real ``python -m app.cli`` process: one line on
stderr, no traceback, and the documented exit status.
"""

from __future__ import annotations

import csv
import json
import re
import signal
import subprocess
import sys

import httpx
import numpy as np
import pytest
from normcal_client import NormcalClient

from app.api.app import create_app
from app.cli.main import (
    EXIT_API,
    EXIT_CANNOT_LISTEN,
    EXIT_INPUT,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    _ProgressEmbedder,
    build_parser,
    main,
)
from app.settings import Settings
from tests.support.fakes import HashEmbedder
from tests.support.live import ThreadServer
from tests.support.server import (
    ServerProcess,
    refused_port,
    run_cli,
    source_env,
    wait_for_port_file,
)

TOPICS = {
    "volcano": [
        "Lava flows from an erupting volcano.",
        "Magma chambers feed volcanic eruptions.",
        "Ash clouds follow a volcanic blast.",
    ],
    "piano": [
        "The piano has eighty-eight keys.",
        "Pianists practise scales daily.",
        "A grand piano needs regular tuning.",
    ],
    "coffee": [
        "Coffee beans are roasted before brewing.",
        "Espresso is brewed under pressure.",
        "Arabica coffee grows at altitude.",
    ],
    "glacier": [
        "Glaciers carve U-shaped valleys.",
        "Ice sheets flow slowly downhill.",
        "Melting glaciers raise sea levels.",
    ],
    "bicycle": [
        "A bicycle chain drives the rear wheel.",
        "Cyclists shift gears on hills.",
        "Bike tyres need the right pressure.",
    ],
    "honeybee": [
        "Honeybees dance to share food locations.",
        "A hive has one queen bee.",
        "Bees make honey from nectar.",
    ],
    "satellite": [
        "Satellites orbit the Earth.",
        "GPS uses a constellation of satellites.",
        "Geostationary satellites stay above one point.",
    ],
    "bread": [
        "Yeast makes bread dough rise.",
        "Sourdough uses a wild starter.",
        "Bread is baked in a hot oven.",
    ],
}
QUERIES = {
    "volcano": ["why do volcanoes erupt", "what is lava"],
    "piano": ["how many keys does a piano have", "learning to play piano"],
    "coffee": ["how is espresso made", "where does coffee grow"],
    "glacier": ["how do glaciers move", "glacier melting effects"],
    "bicycle": ["how does a bike chain work", "bicycle gears"],
    "honeybee": ["how do bees communicate", "how is honey made"],
    "satellite": ["how does GPS work", "what keeps satellites in orbit"],
    "bread": ["why does bread rise", "what is sourdough"],
}


@pytest.fixture
def beir_dir(tmp_path):
    root = tmp_path / "toy"
    (root / "qrels").mkdir(parents=True)
    with (root / "corpus.jsonl").open("w") as fh:
        for topic, texts in TOPICS.items():
            for i, text in enumerate(texts):
                fh.write(
                    json.dumps({"_id": f"{topic}-{i}", "title": "", "text": text})
                    + "\n"
                )
    rows = ["query-id\tcorpus-id\tscore"]
    with (root / "queries.jsonl").open("w") as fh:
        for topic, queries in QUERIES.items():
            for j, query in enumerate(queries):
                qid = f"q-{topic}-{j}"
                fh.write(json.dumps({"_id": qid, "text": query}) + "\n")
                rows += [f"{qid}\t{topic}-{i}\t1" for i in range(len(TOPICS[topic]))]
        # Same text as another query (merged by the server), and a qrels row whose
        # query is not in queries.jsonl (dropped): 18 qrels queries, 16 texts.
        fh.write(json.dumps({"_id": "q-dup", "text": "what is lava"}) + "\n")
    rows += ["q-dup\tvolcano-1\t1", "q-unknown\tbread-0\t1"]
    (root / "qrels" / "train.tsv").write_text("\n".join(rows) + "\n")
    (root / "qrels" / "test.tsv").write_text("\n".join(rows[:5]) + "\n")
    return root


def test_ingest_then_fit(tmp_path, embedder, beir_dir, capsys):
    settings = Settings(data_dir=tmp_path / "data")
    with ThreadServer(create_app(settings, embedder=embedder)) as server:
        assert (
            main(["ingest", str(beir_dir), "--collection", "toy", "--url", server.url])
            == 0
        )
        assert "ingested 24 documents" in capsys.readouterr().out
        info = httpx.get(f"{server.url}/v1/collections/toy").json()
        assert info["documents"] == info["indexed"] == 24
        # Re-ingesting is idempotent.
        assert (
            main(["ingest", str(beir_dir), "--collection", "toy", "--url", server.url])
            == 0
        )
        assert httpx.get(f"{server.url}/v1/collections/toy").json()["documents"] == 24

        code = main(
            [
                "fit",
                str(beir_dir),
                "--collection",
                "toy",
                "--url",
                server.url,
                "--k",
                "6",
                "--method",
                "platt",
            ]
        )
        captured = capsys.readouterr()
        out = captured.out
        assert code == 0, out
        assert "(platt, active=True) on 16 queries" in out and "| nt-list |" in out
        assert "served: platt (requested: served as asked)" in out
        # Why 18 judged queries became 16.
        assert (
            "18 queries in qrels/train.tsv -> 16 distinct query texts: "
            "1 not in queries.jsonl (dropped); 1 share their text" in captured.err
        )
        active = httpx.get(f"{server.url}/v1/collections/toy").json()["calibrator"]
        assert active["method"] == "platt" and active["default"] is False

        # auto says what it served and each rule's outcome in one line.
        argv = ["fit", str(beir_dir), "--collection", "toy", "--url", server.url]
        assert main([*argv, "--k", "6"]) == 0
        out = capsys.readouterr().out
        served = re.search(
            r"^served: (\S+)( \+ recalibration)? \(one-se: [^;]+; "
            r"ece-guard: [^;]+; rank-guard: [^;]+; recalibration: (not )?applied\)$",
            out,
            re.MULTILINE,
        )
        assert served is not None, out
        assert f"({served[1]}, active=True) on 16 queries" in out

        # A bad request reports the problem and exits non-zero.
        assert (
            main(["fit", str(beir_dir), "--collection", "nope", "--url", server.url])
            == EXIT_API
        )
        assert "404" in capsys.readouterr().err


def test_fit_says_what_it_fitted_on_and_follows_the_job(
    tmp_path, embedder, beir_dir, capsys
):
    settings = Settings(data_dir=tmp_path / "data")
    with ThreadServer(create_app(settings, embedder=embedder)) as server:
        url = ["--collection", "toy", "--url", server.url]
        assert main(["ingest", str(beir_dir), *url]) == 0
        # Judged on the page: two queries the file lacks, one it has.
        page = [
            {"query": q, "document_id": d, "relevance": 1}
            for q, d in (
                ("what do ash clouds follow", "volcano-2"),
                ("what do bees make", "honeybee-2"),
                ("what is lava", "volcano-0"),
            )
        ]
        with NormcalClient(server.url) as client:
            client.feedback("toy", page)
        capsys.readouterr()
        fit = ["fit", str(beir_dir), *url, "--k", "6", "--method", "platt"]
        assert main(fit) == 0
        captured = capsys.readouterr()
        # 16 query texts and 49 judgments in the file (with the merged duplicate).
        assert (
            "fitted on 18 judged queries: 49 judgments of qrels/train.tsv "
            "(16 queries) and 3 stored feedback judgments (3 queries; the judging "
            "page's and POST .../feedback's: --no-feedback leaves them out)"
        ) in captured.out
        assert "on 18 queries" in captured.out
        assert "fit: done" in captured.err  # the job's stages, the last one
        assert main([*fit, "--no-feedback"]) == 0
        out = capsys.readouterr().out
        assert (
            "fitted on 16 judged queries: 49 judgments of qrels/train.tsv "
            "(16 queries)\n"
        ) in out
        assert "on 16 queries" in out and "stored feedback" not in out


def test_fit_help_says_what_abstain_target_means(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert (
        "--abstain-target ABSTAIN_TARGET tolerated share of answered queries "
        "(abstain false) that have no relevant hit in the top k"
    ) in text
    assert "--feedback, --no-feedback also fit on the judgments stored" in text


def _cli(*args, **env):
    """``python -m app.cli ARGS`` in a child process; returns (code, stderr)."""
    done = run_cli(*map(str, args), timeout=300, **env)
    return done.returncode, done.stderr


def _one_line_error(stderr, *, alone=True):
    """The error line: the last of stderr, the only ``normcal:`` one, no traceback.

    ``alone=False`` allows progress bars and notes before it.
    """
    assert "Traceback" not in stderr, stderr
    lines = [line for line in re.split(r"[\r\n]", stderr) if line.strip()]
    errors = [line for line in lines if line.startswith("normcal: ")]
    assert len(errors) == 1 and errors[0] == lines[-1], stderr
    assert not alone or len(lines) == 1, stderr
    return errors[0]


def _input_cases(tmp, beir):
    (tmp / "notes.txt").write_text("hello\n")
    (tmp / "bad.jsonl").write_text('{"id": "a", "text": "ok"}\n{"id": "b", "text": \n')
    (tmp / "noid.jsonl").write_text('{"text": "no id"}\n')
    (tmp / "bad.csv").write_text("name,body\nx,y\n")
    url = "http://127.0.0.1:9"  # never contacted: the input is refused first
    col = ["--collection", "c", "--url", url]
    return [
        (["ingest", tmp / "missing", *col], "missing: no such file or folder"),
        (["ingest", tmp, *col], "no corpus.jsonl in this folder"),
        (["ingest", tmp / "notes.txt", *col], "unknown format"),
        (["ingest", tmp / "bad.jsonl", *col], "bad.jsonl:2: not JSON"),
        (["ingest", tmp / "noid.jsonl", *col], "noid.jsonl:1: needs an 'id'"),
        (["ingest", tmp / "bad.csv", *col], "must name an 'id' and a 'text' column"),
        (["fit", tmp / "missing", *col], "missing: no such folder"),
        (
            ["fit", beir, "--split", "dev", *col],
            "no qrels split 'dev' (available: test, train)",
        ),
        (["eval", tmp / "missing"], "missing: no such folder"),
        (
            ["eval", beir, "--split", "dev"],
            "no qrels split 'dev' (available: test, train)",
        ),
        (["eval", beir, "--fit-split", "nope"], "no qrels split 'nope'"),
    ]


@pytest.mark.slow
def test_input_errors_are_one_line_and_exit_3(tmp_path, beir_dir):
    for args, message in _input_cases(tmp_path, beir_dir):
        code, err = _cli(*args)
        line = _one_line_error(err)
        assert code == EXIT_INPUT, (args, err)
        assert message in line, (args, line)


@pytest.mark.slow  # starts a Python process
def test_usage_errors_exit_2(tmp_path, beir_dir):
    code, err = _cli("ingest", beir_dir, "--collection", "c", "--url", "localhost:8000")
    assert code == EXIT_USAGE and "Traceback" not in err
    assert "is not an http:// or https:// URL" in err
    code, err = _cli("ingest", beir_dir, "--collection", "c", "--batch-size", "0")
    assert code == EXIT_USAGE and "is not a positive integer" in err
    # Invalid settings are refused before the model loads.
    code, err = _cli("eval", beir_dir, "--split", "train", NORMCAL_EMBED_BATCH_SIZE="0")
    assert code == EXIT_USAGE
    assert "NORMCAL_EMBED_BATCH_SIZE" in _one_line_error(err)


def test_eval_url_without_a_collection_is_refused_not_run_locally(beir_dir, capsys):
    assert main(["eval", str(beir_dir), "--url", "http://127.0.0.1:9"]) == EXIT_USAGE
    line = _one_line_error(capsys.readouterr().err)
    assert "--url evaluates a served collection: name it with --collection C" in line


@pytest.mark.slow
def test_server_not_running_exits_4(beir_dir):
    with refused_port() as port:
        url = f"http://127.0.0.1:{port}"
        for command in ("ingest", "fit", "eval"):
            code, err = _cli(command, beir_dir, "--collection", "c", "--url", url)
            line = _one_line_error(err, alone=False)  # fit notes the merged query
            assert code == EXIT_UNREACHABLE, err
            assert f"cannot reach the server at {url}" in line
            assert "ConnectError" in line and "normcal serve" in line


@pytest.mark.slow
def test_api_errors_are_the_problem_in_one_line(tmp_path, embedder, beir_dir):
    settings = Settings(data_dir=tmp_path / "data")
    with ThreadServer(create_app(settings, embedder=embedder)) as server:
        code, err = _cli("fit", beir_dir, "--collection", "nope", "--url", server.url)
        line = _one_line_error(err, alone=False)  # after the merge note
        assert code == EXIT_API
        assert "404 Not found: collection 'nope' does not exist (urn:request:" in line
        assert "{" not in line  # no raw JSON
        code, err = _cli(
            "ingest", beir_dir, "--collection", "bad name!", "--url", server.url
        )
        line = _one_line_error(err)
        assert code == EXIT_API
        assert "422 Request validation failed: name:" in line and '"status"' not in line


def test_ingest_jsonl_and_csv_with_metadata(tmp_path, embedder, capsys):
    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text(
        json.dumps(
            {
                "id": "j1",
                "text": "Lava flows downhill.",
                "metadata": {"lang": "en", "n": 2},
            }
        )
        + "\n\n"
        + json.dumps({"id": 7, "text": "Glaciers move slowly."})
        + "\n"
    )
    table = tmp_path / "docs.csv"
    with table.open("w", newline="", encoding="utf-8-sig") as fh:
        writer = csv.writer(fh)
        writer.writerow(["id", "text", "source", "year"])
        writer.writerow(["c1", "Bread rises with yeast, slowly.", "wiki", "2020"])
        writer.writerow(["c2", "Espresso, brewed under pressure.", "", "2021"])
    settings = Settings(data_dir=tmp_path / "data")
    with ThreadServer(create_app(settings, embedder=embedder)) as server:
        for source in (jsonl, table):
            args = ["ingest", str(source), "--collection", "mixed", "--url", server.url]
            assert main(args) == 0
        assert "ingested 2 documents" in capsys.readouterr().out
        docs = f"{server.url}/v1/collections/mixed/documents"
        assert httpx.get(f"{docs}/j1").json()["metadata"] == {"lang": "en", "n": 2}
        assert httpx.get(f"{docs}/7").json()["text"] == "Glaciers move slowly."
        c1 = httpx.get(f"{docs}/c1").json()
        assert c1["metadata"] == {"source": "wiki", "year": 2020}
        assert c1["text"] == "Bread rises with yeast, slowly."
        assert httpx.get(f"{docs}/c2").json()["metadata"] == {"year": 2021}


def test_csv_metadata_is_typed_by_column_and_filters_find_it(
    tmp_path, embedder, capsys
):
    """Numbers and booleans become JSON numbers and booleans, a column as a whole;
    ids, zip codes, NaN and integers past 64 bits stay text, as --text-column keeps."""
    table = tmp_path / "papers.csv"
    rows = [
        ["id", "text", "year", "score", "open", "zip", "code", "big", "ref", "note"],
        [
            "1",
            "Aspirin and the heart.",
            "2001",
            "0.5",
            "TRUE",
            "02134",
            "7",
            "1",
            "a1",
            "NaN",
        ],
        [
            "2",
            "Statins and cholesterol.",
            "1998",
            "2.25",
            "false",
            "10001",
            "8",
            "",
            "",
            "x",
        ],
        [
            "3",
            "Paris is in France.",
            "2010",
            "-3",
            "True",
            "94110",
            "9",
            "9" * 20,
            "a3",
            "1e3",
        ],
    ]
    with table.open("w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows(rows)
    settings = Settings(data_dir=tmp_path / "data")
    url = "/v1/collections/papers"
    with ThreadServer(create_app(settings, embedder=embedder)) as server:
        args = ["ingest", str(table), "--collection", "papers", "--url", server.url]
        assert main([*args, "--text-column", "code"]) == 0
        out = capsys.readouterr().out
        assert "metadata columns: year (number), score (number), open (boolean)" in out
        assert "zip (text: line 2 has '02134', not a number; the others are)" in out
        assert "code (text: --text-column)" in out
        assert "big (text: line 4 has '99999999999999999999'" in out
        metadata = httpx.get(f"{server.url}{url}/documents/1").json()["metadata"]
        assert metadata == {
            "year": 2001,
            "score": 0.5,
            "open": True,
            "zip": "02134",
            "code": "7",
            "big": "1",
            "ref": "a1",
            "note": "NaN",
        }
        assert (
            "big" not in httpx.get(f"{server.url}{url}/documents/2").json()["metadata"]
        )

        def count(where: dict[str, object]) -> int:
            r = httpx.post(f"{server.url}{url}/documents/count", json={"filter": where})
            assert r.status_code == 200, r.text
            return int(r.json()["count"])

        assert count({"year": {"$gte": 2000}}) == 2  # the filter
        assert count({"open": True}) == 2
        assert count({"score": {"$lt": 0}}) == 1
        assert count({"zip": "02134"}) == 1
        assert count({"code": "7"}) == 1

        # --text-column only for CSV, and only for a column the file has.
        for bad, says in (
            (["--text-column", "zipp"], "'zipp' is not a metadata column"),
            (["--text-column", "id"], "'id' is not a metadata column"),
        ):
            assert main([*args, *bad]) == EXIT_INPUT
            assert says in _one_line_error(capsys.readouterr().err)
        jsonl = tmp_path / "docs.jsonl"
        jsonl.write_text('{"id": "j", "text": "t"}\n')
        argv = ["ingest", str(jsonl), "--collection", "papers", "--url", server.url]
        assert main([*argv, "--text-column", "year"]) == EXIT_INPUT
        assert "applies to a .csv file only" in capsys.readouterr().err


def test_skip_existing_resumes_without_resending(tmp_path, embedder, beir_dir, capsys):
    settings = Settings(data_dir=tmp_path / "data")
    with ThreadServer(create_app(settings, embedder=embedder)) as server:
        base = ["ingest", str(beir_dir), "--collection", "kb", "--url", server.url]
        assert main([*base, "--limit", "10", "--batch-size", "4"]) == 0  # "interrupted"
        # A stored document changed since: a resumed ingest must not overwrite it.
        doc = f"{server.url}/v1/collections/kb/documents/volcano-0"
        httpx.put(
            f"{server.url}/v1/collections/kb/documents",
            json={"documents": [{"id": "volcano-0", "text": "edited meanwhile"}]},
        ).raise_for_status()
        capsys.readouterr()
        assert main([*base, "--skip-existing", "--batch-size", "4"]) == 0
        out = capsys.readouterr().out
        assert "ingested 14 documents into 'kb', 10 already stored were skipped" in out
        assert httpx.get(doc).json()["text"] == "edited meanwhile"
        assert httpx.get(f"{server.url}/v1/collections/kb").json()["documents"] == 24


def test_eval_embedding_shows_progress_and_keeps_results(capsys):
    inner = HashEmbedder()
    texts = [f"document number {i} about topic {i % 7}" for i in range(1100)]
    shown = _ProgressEmbedder(inner).embed(texts, "document")
    whole = inner.embed(texts, "document")
    for field in ("vectors", "norms", "n_tokens", "truncated"):
        assert np.array_equal(getattr(shown, field), getattr(whole, field)), field
    err = capsys.readouterr().err
    assert "embedding documents" in err and "1100/1100" in err


def test_help_shows_defaults_and_exit_codes(capsys):
    parser = build_parser()
    texts = [parser.format_help()]
    actions = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for name, sub in actions.items():
        text = sub.format_help()
        texts.append(text)
        for action in sub._actions:
            if action.option_strings and action.dest != "help" and not action.required:
                assert "default" in (sub._get_formatter()._get_help_string(action)), (
                    name,
                    action.dest,
                )
    every = " ".join(" ".join(texts).split())  # unwrapped
    assert "``" not in every and "as the product grows" not in every
    assert "(default: 128)" in every and "(default: 5 10 30 100)" in every
    for code in ("2 ", "3 ", "4 ", "5 "):
        assert f"\n  {code}   " in texts[0]


def test_no_command_prints_every_command_and_exits_2(capsys):
    """``normcal`` alone: the help, with the commands and exit statuses, to stdout."""
    assert main([]) == EXIT_USAGE
    out = capsys.readouterr().out
    commands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    for name in commands:
        assert f"\n    {name}" in out, name
    assert "exit status:" in out and f"\n  {EXIT_CANNOT_LISTEN}    " in out


def test_version_is_one_line_with_python_and_model(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    line = capsys.readouterr().out
    assert re.fullmatch(
        r"normcal \d+\.\d+\.\d+\S* \(python 3\.\d+\.\d+, model \S+\)\n", line
    ), line


@pytest.mark.server
def test_busy_port_is_one_line_naming_it_and_exit_7(tmp_path):
    """A second server on a port in use names host and port; the first logs JSON.

    The first server's stderr is a file, not a terminal: ``NORMCAL_LOG_FORMAT=auto``
    writes JSON lines, and uvicorn's ``color_message`` (ANSI) stays out of them.
    """
    log_path = tmp_path / "first.log"
    with log_path.open("wb") as log:
        first = ServerProcess(
            tmp_path / "first",
            env=source_env(NORMCAL_LOG_LEVEL="INFO", NORMCAL_LOG_FORMAT="auto"),
            log=log,
        ).start()
        try:
            code, err = _cli(
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                first.port,
                "--data-dir",
                tmp_path / "second",
                NORMCAL_LOG_LEVEL="WARNING",
                NORMCAL_LOG_FORMAT="text",
            )
        finally:
            assert first.stop() in (0, -signal.SIGTERM)
    line = _one_line_error(err)
    assert code == EXIT_CANNOT_LISTEN, err
    assert line.startswith(
        f"normcal: cannot listen on 127.0.0.1:{first.port}: address already in use;"
    ), line
    text = log_path.read_text()
    assert "\x1b[" not in text and "color_message" not in text
    entries = [json.loads(raw) for raw in text.splitlines()]
    assert any(e["msg"].startswith("normcal listening on") for e in entries)


@pytest.mark.slow
def test_serve_honours_normcal_host_and_port(tmp_path):
    """No --host/--port: NORMCAL_HOST and NORMCAL_PORT (0: any free port) apply."""
    port_file = tmp_path / "port"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "app.cli",
            "serve",
            "--port-file",
            str(port_file),
            "--data-dir",
            str(tmp_path / "data"),
        ],
        env=source_env(
            HF_HUB_OFFLINE="1",
            NORMCAL_HOST="127.0.0.1",
            NORMCAL_PORT="0",
            NORMCAL_LOG_LEVEL="WARNING",
        ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        port = wait_for_port_file(port_file, proc, timeout=120)
        assert port != 8000
        with NormcalClient(f"http://127.0.0.1:{port}") as client:
            client.wait_until_ready(timeout=120)  # the model loads after the bind
    finally:
        proc.terminate()  # uvicorn re-raises SIGTERM after its graceful shutdown
        proc.wait(60)


@pytest.mark.slow  # starts a Python process
def test_restore_is_refused_on_milvus_storage_and_touches_nothing(tmp_path):
    """Local-only: with NORMCAL_STORAGE=milvus, one line naming what to use instead."""
    snapshot = tmp_path / "kb.snapshot"
    snapshot.write_bytes(b"not read")
    data_dir = tmp_path / "data"
    uri = tmp_path / "milvus.db"
    code, err = _cli(
        "restore",
        snapshot,
        "--collection",
        "kb",
        "--data-dir",
        data_dir,
        NORMCAL_STORAGE="milvus",
        NORMCAL_MILVUS_URI=str(uri),
    )
    line = _one_line_error(err)
    assert code == EXIT_USAGE, err
    assert "NORMCAL_STORAGE=milvus" in line and str(uri) in line
    assert "milvus-backup" in line
    assert not data_dir.exists() and not uri.exists()


def test_fit_no_wait_prints_the_job_and_its_url(tmp_path, embedder, beir_dir, capsys):
    settings = Settings(data_dir=tmp_path / "data")
    with ThreadServer(create_app(settings, embedder=embedder)) as server:
        url = server.url
        assert main(["ingest", str(beir_dir), "--collection", "toy", "--url", url]) == 0
        capsys.readouterr()
        argv = ["fit", str(beir_dir), "--collection", "toy", "--url", url]
        code = main([*argv, "--k", "6", "--method", "platt", "--no-wait"])
        out = capsys.readouterr().out
        assert code == 0, out
        found = re.fullmatch(r"fit job (\S+) (queued|running|succeeded): (\S+)\n", out)
        assert found is not None, out
        job_id, job_url = found[1], found[3]
        assert job_url == f"{url}/v1/collections/toy/fit-jobs/{job_id}"
        with NormcalClient(url) as client:
            job = client.wait_fit_job("toy", job_id, timeout=300, poll_interval=0.2)
        assert job.status == "succeeded", job.error
        assert httpx.get(job_url).json()["status"] == "succeeded"
        calibrator = httpx.get(f"{url}/v1/collections/toy").json()["calibrator"]
        assert calibrator["method"] == "platt" and calibrator["default"] is False
        # a bad request is still refused at once, with the problem in one line
        assert main([*argv[:3], "nope", *argv[4:], "--no-wait"]) == EXIT_API
        assert "404" in capsys.readouterr().err
