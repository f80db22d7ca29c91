"""Soak: many clients mixing every kind of write against one real server, then kill -9.

16 clients (``--clients``) run for 5 minutes (``--seconds``) against a ``normcal
serve`` subprocess with the real model: searches in every mode, upserts, deletes,
feedback, fit jobs, calibrator imports and snapshots, over two collections. Every
write the server acknowledged is recorded; then the server is SIGKILLed, started
again, and every acknowledged write is checked:

- each document a client upserted (and did not delete after) is there with the text
  of its last acknowledged upsert; each it deleted is gone (each client owns its ids,
  so its writes to one id are ordered);
- every acknowledged feedback pair is stored; every acknowledged import and snapshot
  is listed;
- SQLite, the BM25 index and FAISS hold the same number of documents.

Prints requests by kind and status, 5xx (must be 0 apart from documented 503s),
acknowledged writes, how many were lost (must be 0), RSS at start and end. Exits 1
when a write was lost or an undocumented 5xx was answered.

``--storage milvus-shared`` runs the same on Milvus Lite 3.x in the shared layout
(``NORMCAL_MILVUS_LAYOUT=shared``: the tenants' rows in the same Milvus collections)
with three tenants: the clients write to ``alice`` and ``bob`` (no snapshots: a
local-backend feature), while ``eve`` sends hostile ids and filters for the whole
run (quote-breaking ids, another tenant's keys, filters on such values; gets,
patches, deletes by id, by ids and by filter, searches, upserts of such ids). After
the kill -9 it also checks that no document of ``alice`` or ``bob`` changed (their
seed documents exactly as written, no document that no client acknowledged), and
counts answers to ``eve`` that held another tenant's document (``leaks``). Exits 1
too when either is not 0.

    python benchmarks/soak.py [--seconds 300] [--clients 16] [--storage local]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.cli.process import ServerProcess

COLLECTIONS = ("soak-a", "soak-b")
TENANTS = ("alice", "bob")  # --storage milvus-shared: the clients' collections
HOSTILE_TENANT = "eve"
TOPICS = {
    "volcano": "Volcanoes erupt molten rock, ash and gas from the earth's mantle.",
    "violin": "The violin is a bowed string instrument with four strings.",
    "bread": "Bread is baked from flour, water and yeast dough.",
    "comet": "A comet is an icy body that releases gas near the sun.",
    "tax": "Income tax is levied by governments on earnings.",
    "tennis": "Tennis players hit a ball over a net with rackets.",
}
SEED_PER_TOPIC = 8


def rss_kib(pid: int) -> int:
    """Resident set size of ``pid`` in KiB (Linux ``/proc``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def seed_documents(owner: str = "") -> list[dict[str, Any]]:
    """The seed documents (``owner``: recorded in their metadata)."""
    mine = {"owner": owner} if owner else {}
    return [
        {
            "id": f"seed-{t}-{i}",
            "text": f"{text} Note {i}.",
            "metadata": {"topic": t, **mine},
        }
        for t, text in TOPICS.items()
        for i in range(SEED_PER_TOPIC)
    ]


# Ids and filter values eve sends: quote-breaking, other tenants' keys and ids.
HOSTILE = [
    "seed-volcano-0'] or tpk not in ['",
    "seed-volcano-0'] or id not in ['",
    "seed-violin-1' or tpk != '",
    "seed-bread-2') or (tpk != '",
    'seed-comet-3" or tpk != "',
    'seed-tax-4"] or tpk != ["',
    "' or '1'='1",
    "alice/seed-volcano-0",
    "bob/seed-tennis-7",
    "seed-tennis-7\\",
    "seed-bread-1, seed-bread-2",
    "[seed-comet-0]",
    "O'Brien",
    "seed-volcano-0",
]


def judgments(rng: random.Random, tag: str) -> list[dict[str, Any]]:
    """One judged query per topic: its seed documents relevant, two others not."""
    rows = []
    for topic in TOPICS:
        query = f"what about {topic}? ({tag})"
        others = [t for t in TOPICS if t != topic]
        for i in rng.sample(range(SEED_PER_TOPIC), 3):
            rows.append(
                {"query": query, "document_id": f"seed-{topic}-{i}", "relevance": 1}
            )
        for other in rng.sample(others, 2):
            doc = f"seed-{other}-{rng.randrange(SEED_PER_TOPIC)}"
            rows.append({"query": query, "document_id": doc, "relevance": 0})
    return rows


@dataclass
class Ledger:
    """What the server acknowledged, and every answer's status."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    statuses: Counter[tuple[str, int]] = field(default_factory=Counter)
    documents: dict[tuple[str, str], str | None] = field(default_factory=dict)
    feedback: Counter[str] = field(default_factory=Counter)
    imports: Counter[str] = field(default_factory=Counter)
    snapshots: Counter[str] = field(default_factory=Counter)
    undocumented_5xx: list[str] = field(default_factory=list)
    leaks: list[str] = field(default_factory=list)  # others' documents shown to eve

    def answer(self, kind: str, response: httpx.Response) -> bool:
        """Record an answer; whether it was a success."""
        with self.lock:
            self.statuses[(kind, response.status_code)] += 1
            documented = (
                response.status_code == 503 and "Retry-After" in response.headers
            )
            if response.status_code >= 500 and not documented:
                self.undocumented_5xx.append(
                    f"{kind} {response.status_code} {response.text[:200]}"
                )
        return response.status_code < 300


def client_loop(
    n: int,
    url: str,
    deadline: float,
    ledger: Ledger,
    profiles: dict[str, Any],
    collections: tuple[str, ...] = COLLECTIONS,
    snapshots: bool = True,
) -> None:
    """One client: a weighted mix of operations on its own ids until ``deadline``."""
    rng = random.Random(n)
    owned: dict[str, list[str]] = {c: [] for c in collections}
    step = 0
    with httpx.Client(base_url=url, timeout=120) as http:
        while time.monotonic() < deadline:
            step += 1
            c = rng.choice(collections)
            base = f"/v1/collections/{c}"
            roll = rng.random()
            try:
                if roll < 0.40:
                    body = {
                        "query": rng.choice(list(TOPICS)) + " facts",
                        "k": 5,
                        "mode": rng.choice(["dense", "lexical", "hybrid"]),
                    }
                    ledger.answer("search", http.post(f"{base}/search", json=body))
                elif roll < 0.62:
                    doc_id = f"c{n}-{step}"
                    text = (
                        f"{rng.choice(list(TOPICS.values()))} Client {n} step {step}."
                    )
                    body = {
                        "documents": [
                            {
                                "id": doc_id,
                                "text": text,
                                "metadata": {"n": n, "owner": c},
                            }
                        ]
                    }
                    if ledger.answer(
                        "upsert", http.put(f"{base}/documents", json=body)
                    ):
                        with ledger.lock:
                            ledger.documents[(c, doc_id)] = text
                        owned[c].append(doc_id)
                elif roll < 0.72:
                    if not owned[c]:
                        continue
                    doc_id = owned[c].pop(rng.randrange(len(owned[c])))
                    if ledger.answer(
                        "delete", http.delete(f"{base}/documents/{doc_id}")
                    ):
                        with ledger.lock:
                            ledger.documents[(c, doc_id)] = None
                elif roll < 0.82:
                    rows = judgments(rng, f"client {n} step {step}")[:5]
                    body = {"judgments": rows}
                    if ledger.answer(
                        "feedback", http.post(f"{base}/feedback", json=body)
                    ):
                        with ledger.lock:
                            ledger.feedback[c] += len(rows)
                elif roll < 0.86:
                    body = {"judgments": judgments(rng, f"fit {n}"), "activate": False}
                    ledger.answer("fit-job", http.post(f"{base}/fit-jobs", json=body))
                elif roll < 0.90:
                    body = {"profile": profiles[c], "activate": rng.random() < 0.5}
                    response = http.post(f"{base}/calibrators/import", json=body)
                    if ledger.answer("import", response):
                        with ledger.lock:
                            ledger.imports[c] += 1
                elif roll < 0.93 and snapshots:
                    if ledger.answer("snapshot", http.post(f"{base}/snapshots")):
                        with ledger.lock:
                            ledger.snapshots[c] += 1
                else:
                    ledger.answer("list", http.get(f"{base}/calibrators"))
            except httpx.TransportError as error:
                with ledger.lock:
                    ledger.statuses[("transport-error", 0)] += 1
                    ledger.undocumented_5xx.append(f"transport {error!r}")


def setup(
    url: str, collections: tuple[str, ...], snapshots: bool
) -> tuple[dict[str, Any], dict[str, int], dict[str, int]]:
    """Collections with the seed documents and one fitted calibrator each.

    Returns each collection's exported profile (what clients import) and the
    calibrators and snapshots there were before the clients started.
    """
    profiles: dict[str, Any] = {}
    calibrators: dict[str, int] = {}
    listed: dict[str, int] = {}
    rng = random.Random(0)
    with httpx.Client(base_url=url, timeout=300) as http:
        for c in collections:
            http.post("/v1/collections", json={"name": c}).raise_for_status()
            base = f"/v1/collections/{c}"
            http.put(
                f"{base}/documents", json={"documents": seed_documents(c)}
            ).raise_for_status()
            fit = http.post(
                f"{base}/calibrators",
                json={"judgments": judgments(rng, "setup"), "activate": True},
            )
            fit.raise_for_status()
            calibrator_id = fit.json()["id"]
            profiles[c] = http.get(f"{base}/calibrators/{calibrator_id}/export").json()
            calibrators[c] = http.get(f"{base}/calibrators").json()["count"]
            if snapshots:
                listed[c] = http.get(f"{base}/snapshots").json()["count"]
    return profiles, calibrators, listed


def hostile_loop(url: str, deadline: float, ledger: Ledger) -> None:
    """Eve: hostile ids and filters on her own collection until ``deadline``.

    Her own writes that are acknowledged go to the ledger like anyone's (an id of
    :data:`HOSTILE` is a legal id of hers); any answer showing a document whose
    ``owner`` is not eve is a leak.
    """
    rng = random.Random(1_000)
    base = f"/v1/collections/{HOSTILE_TENANT}"

    def shown(kind: str, docs: list[dict[str, Any]]) -> None:
        for doc in docs:
            if doc.get("metadata", {}).get("owner") != HOSTILE_TENANT:
                with ledger.lock:
                    ledger.leaks.append(
                        f"{kind}: {doc.get('id')!r} {doc.get('metadata')}"
                    )

    def wrote(doc_id: str, text: str | None) -> None:
        with ledger.lock:
            ledger.documents[(HOSTILE_TENANT, doc_id)] = text

    with httpx.Client(base_url=url, timeout=120) as http:
        while time.monotonic() < deadline:
            doc_id = rng.choice(HOSTILE)
            path = f"{base}/documents/{quote(doc_id, safe='')}"
            roll = rng.random()
            try:
                if roll < 0.15:
                    response = http.get(path)
                    if ledger.answer("eve-get", response):
                        shown("get", [response.json()])
                elif roll < 0.30:
                    if ledger.answer("eve-delete", http.delete(path)):
                        wrote(doc_id, None)
                elif roll < 0.40:
                    asked = rng.sample(HOSTILE, 3)
                    response = http.post(f"{base}/documents/get", json={"ids": asked})
                    if ledger.answer("eve-get-many", response):
                        shown("get-many", response.json()["data"])
                elif roll < 0.50:
                    asked = rng.sample(HOSTILE, 3)
                    body = {"ids": asked}
                    if ledger.answer(
                        "eve-delete-ids",
                        http.post(f"{base}/documents/delete", json=body),
                    ):
                        for each in asked:
                            wrote(each, None)
                elif roll < 0.62:
                    where = rng.choice([{"owner": doc_id}, {doc_id: "x"}])
                    response = http.post(
                        f"{base}/documents/delete", json={"filter": where}
                    )
                    if ledger.answer("eve-delete-filter", response):
                        if response.json()["deleted"]:
                            with ledger.lock:
                                ledger.leaks.append(f"filter {where} deleted some")
                elif roll < 0.72:
                    body = {"metadata": {"owner": HOSTILE_TENANT, "seen": True}}
                    response = http.patch(path, json=body)
                    if ledger.answer("eve-patch", response):
                        shown("patch", [response.json()])
                elif roll < 0.85:
                    where = rng.choice([{"owner": doc_id}, {doc_id: "x"}, {}])
                    body = {"query": doc_id, "k": 5, "filter": where}
                    response = http.post(f"{base}/search", json=body)
                    if ledger.answer("eve-search", response):
                        shown("search", response.json()["hits"])
                else:
                    text = f"Eve wrote {doc_id} at {time.monotonic()}."
                    doc = {"id": doc_id, "text": text, "metadata": {"owner": "eve"}}
                    response = http.put(f"{base}/documents", json={"documents": [doc]})
                    if ledger.answer("eve-upsert", response):
                        wrote(doc_id, text)
            except httpx.TransportError as error:
                with ledger.lock:
                    ledger.statuses[("transport-error", 0)] += 1
                    ledger.undocumented_5xx.append(f"transport {error!r}")


def all_documents(http: httpx.Client, base: str) -> dict[str, tuple[str, Any]]:
    """``id -> (text, metadata)`` of every document of a collection, paged through."""
    found: dict[str, tuple[str, Any]] = {}
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 1000}
        if cursor:
            params["cursor"] = cursor
        page = http.get(f"{base}/documents", params=params).json()
        found.update({d["id"]: (d["text"], d["metadata"]) for d in page["data"]})
        cursor = page.get("next_cursor")
        if not cursor:
            return found


def others_changed(url: str, ledger: Ledger) -> list[str]:
    """Documents of alice and bob that differ from what they were told to hold.

    Their seeds exactly as written (no client of theirs changes one), and nothing
    that no client acknowledged.
    """
    changed: list[str] = []
    with httpx.Client(base_url=url, timeout=120) as http:
        for tenant in TENANTS:
            held = all_documents(http, f"/v1/collections/{tenant}")
            for seed in seed_documents(tenant):
                if held.get(seed["id"]) != (seed["text"], seed["metadata"]):
                    changed.append(f"{tenant}/{seed['id']}: {held.get(seed['id'])}")
            written = {
                doc_id
                for (c, doc_id), text in ledger.documents.items()
                if c == tenant and text is not None
            }
            seeds = {d["id"] for d in seed_documents(tenant)}
            changed += [
                f"{tenant}/{i}: not written" for i in held.keys() - seeds - written
            ]
    return changed


def feedback_count(http: httpx.Client, base: str) -> int:
    """Stored judgments of a collection, paged through."""
    total, cursor = 0, None
    while True:
        params: dict[str, Any] = {"limit": 1000}
        if cursor:
            params["cursor"] = cursor
        page = http.get(f"{base}/feedback", params=params).json()
        total += len(page["data"])
        cursor = page.get("next_cursor")
        if not cursor:
            return total


def verify(
    url: str,
    ledger: Ledger,
    calibrators: dict[str, int],
    snapshots: dict[str, int],
    collections: tuple[str, ...] = COLLECTIONS,
) -> list[str]:
    """Every acknowledged write that the restarted server does not hold."""
    lost: list[str] = []
    with httpx.Client(base_url=url, timeout=120) as http:
        for (c, doc_id), text in ledger.documents.items():
            got = http.get(f"/v1/collections/{c}/documents/{quote(doc_id, safe='')}")
            if text is None and got.status_code != 404:
                lost.append(f"delete of {c}/{doc_id} ({got.status_code})")
            elif text is not None and (
                got.status_code != 200 or got.json()["text"] != text
            ):
                lost.append(f"upsert of {c}/{doc_id} ({got.status_code})")
        for c in collections:
            base = f"/v1/collections/{c}"
            info = http.get(base).json()
            counts = {k: info[k] for k in ("documents", "indexed", "lexical_indexed")}
            if len(set(counts.values())) > 1:
                lost.append(f"{c}: the stores disagree {counts}")
            stored = feedback_count(http, base)
            # Each acknowledged (query, document) pair is new: one client, one step.
            if stored != ledger.feedback[c]:
                lost.append(
                    f"{c}: feedback {stored} stored, {ledger.feedback[c]} acknowledged"
                )
            listed = http.get(f"{base}/calibrators").json()["count"]
            if listed < calibrators[c] + ledger.imports[c]:
                lost.append(
                    f"{c}: {listed} calibrators listed, {calibrators[c]} + {ledger.imports[c]} imported"
                )
            if c not in snapshots:  # Milvus: no snapshots
                continue
            listed = http.get(f"{base}/snapshots").json()["count"]
            if listed != snapshots[c] + ledger.snapshots[c]:
                lost.append(
                    f"{c}: {listed} snapshots listed, {ledger.snapshots[c]} acknowledged"
                )
    return lost


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument(
        "--storage", choices=["local", "milvus-shared"], default="local"
    )
    args = parser.parse_args()
    shared = args.storage == "milvus-shared"
    collections = TENANTS if shared else COLLECTIONS
    every = (*TENANTS, HOSTILE_TENANT) if shared else COLLECTIONS
    with tempfile.TemporaryDirectory(prefix="normcal-soak-") as tmp:
        env = (
            {
                "NORMCAL_STORAGE": "milvus",
                "NORMCAL_MILVUS_URI": str(Path(tmp) / "milvus.db"),
                "NORMCAL_MILVUS_LAYOUT": "shared",
            }
            if shared
            else {}
        )
        log = open(Path(tmp) / "server.log", "wb")
        server = ServerProcess(Path(tmp) / "data", env=env, log=log).start(600)
        assert server.proc is not None
        profiles, calibrators, snapshots = setup(server.url, every, not shared)
        rss_start = rss_kib(server.proc.pid)
        ledger = Ledger()
        if shared:  # eve's seeds are hers to delete: in the ledger like her writes
            for doc in seed_documents(HOSTILE_TENANT):
                ledger.documents[(HOSTILE_TENANT, doc["id"])] = doc["text"]
        deadline = time.monotonic() + args.seconds
        threads = [
            threading.Thread(
                target=client_loop,
                args=(n, server.url, deadline, ledger, profiles, collections),
                kwargs={"snapshots": not shared},
            )
            for n in range(args.clients)
        ]
        if shared:
            threads.append(
                threading.Thread(
                    target=hostile_loop, args=(server.url, deadline, ledger)
                )
            )
        started = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.monotonic() - started
        rss_end = rss_kib(server.proc.pid)
        server.kill()
        server.start(600)
        lost = verify(server.url, ledger, calibrators, snapshots, every)
        changed = others_changed(server.url, ledger) if shared else []
        server.stop()
        log.close()
    requests = sum(ledger.statuses.values())
    by_kind: dict[str, dict[int, int]] = {}
    for (kind, status), count in sorted(ledger.statuses.items()):
        by_kind.setdefault(kind, {})[status] = count
    writes = (
        len(ledger.documents)
        + sum(ledger.feedback.values())
        + sum(ledger.imports.values())
        + sum(ledger.snapshots.values())
    )
    report: dict[str, Any] = {
        "storage": args.storage,
        "clients": args.clients,
        "seconds": round(elapsed, 1),
        "requests": requests,
        "requests_per_second": round(requests / elapsed, 1),
        "statuses": by_kind,
        "undocumented_5xx": len(ledger.undocumented_5xx),
        "acknowledged_writes": writes,
        "lost_after_kill_9": len(lost),
        "rss_mib": {"start": rss_start // 1024, "end": rss_end // 1024},
    }
    if shared:
        report["hostile_requests"] = sum(
            n for (kind, _), n in ledger.statuses.items() if kind.startswith("eve-")
        )
        report["other_tenants_changed"] = len(changed)
        report["leaks"] = len(ledger.leaks)
    print(json.dumps(report, indent=2))
    for line in (ledger.undocumented_5xx + lost + changed + ledger.leaks)[:20]:
        print("  ", line)
    return 1 if lost or ledger.undocumented_5xx or changed or ledger.leaks else 0


if __name__ == "__main__":
    raise SystemExit(main())
