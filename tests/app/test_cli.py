"""``normcal ingest`` and ``normcal fit`` against a real server on loopback."""

from __future__ import annotations

import json

import httpx
import pytest

from app.api.app import create_app
from app.ops.cli import main
from app.settings import Settings
from tests.app.live import ThreadServer

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
    (root / "qrels" / "train.tsv").write_text("\n".join(rows) + "\n")
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
        out = capsys.readouterr().out
        assert code == 0, out
        assert "(platt, active=True) on 16 queries" in out and "| nt-list |" in out
        active = httpx.get(f"{server.url}/v1/collections/toy").json()["calibrator"]
        assert active["method"] == "platt" and active["default"] is False

        # A bad request reports the problem and exits non-zero.
        assert (
            main(["fit", str(beir_dir), "--collection", "nope", "--url", server.url])
            == 1
        )
        assert "404" in capsys.readouterr().err
