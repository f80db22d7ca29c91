"""Example RAG client: ingest a few documents, ask questions, print probabilities.

Runs as the ``rag-example`` service of compose.yaml (``NORMCAL_URL=http://normcal:8000``)
or on a host against any normcal::

    pip install ./clients/python    # the client alone: httpx + pydantic
    NORMCAL_URL=http://127.0.0.1:8000 NORMCAL_API_KEY=... python docker/example_rag.py

A real pipeline would pass the retrieved texts to an LLM; here the "answer" is the best
hit when normcal is confident enough, and an explicit "I don't know" when it abstains
or no hit is probable enough.
"""

from __future__ import annotations

import os
import sys

from normcal_client import NormcalClient, NormcalError

COLLECTION = os.environ.get("NORMCAL_EXAMPLE_COLLECTION", "example")
MIN_PROBABILITY = float(os.environ.get("NORMCAL_EXAMPLE_MIN_PROBABILITY", "0.5"))

DOCUMENTS = [
    {
        "id": "aspirin",
        "text": "Daily low-dose aspirin lowers the risk of a first heart attack "
        "in some older adults, but raises the risk of bleeding.",
        "metadata": {"topic": "medicine"},
    },
    {
        "id": "statins",
        "text": "Statins reduce LDL cholesterol and the risk of cardiovascular events.",
        "metadata": {"topic": "medicine"},
    },
    {
        "id": "paris",
        "text": "Paris is the capital and largest city of France.",
        "metadata": {"topic": "geography"},
    },
    {
        "id": "faiss",
        "text": "FAISS is a library for efficient similarity search of dense vectors.",
        "metadata": {"topic": "software"},
    },
    {
        "id": "photosynthesis",
        "text": "Plants convert sunlight, water and carbon dioxide into sugar "
        "by photosynthesis.",
        "metadata": {"topic": "biology"},
    },
]

QUESTIONS = [
    "Does aspirin prevent heart attacks?",
    "What is the capital of France?",
    "Which library searches nearest neighbour vectors?",
    "Who won the 1998 football world cup?",  # nothing in the collection answers this
]


def _p(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def main() -> int:
    with NormcalClient.from_env() as nc:
        ready = nc.wait_until_ready(
            timeout=float(os.environ.get("NORMCAL_EXAMPLE_WAIT", "120"))
        )
        print(f"normcal ready: model={ready.model} dim={ready.dim}")
        nc.create_collection(COLLECTION, "normcal example", exist_ok=True)
        ack = nc.upsert_documents(COLLECTION, DOCUMENTS)
        print(f"upserted {ack.upserted} documents into {COLLECTION!r}")

        for question in QUESTIONS:
            result = nc.search(COLLECTION, question, k=3, include_text=True)
            print(f"\nQ: {question}")
            print(
                f"   confidence={_p(result.confidence)} abstain={result.abstain} "
                f"calibrator={result.calibrator.id if result.calibrator else None}"
            )
            for hit in result.hits:
                print(
                    f"   {hit.id:<15} score={hit.score:.3f} "
                    f"p={_p(hit.probability)} norm={hit.norm:.2f}"
                )
            best = result.hits[0] if result.hits else None
            calibrated = best is not None and best.probability is not None
            if result.abstain or best is None:
                print("A: I don't know (normcal abstains).")
            elif calibrated and (best.probability or 0.0) < MIN_PROBABILITY:
                print(f"A: I don't know (best p={_p(best.probability)}).")
            elif calibrated:
                print(f"A: {best.text}")
            else:
                # no calibrator applies yet: cosine alone cannot say "nothing found"
                print(f"A (uncalibrated, best cosine): {best.text}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except NormcalError as error:
        print(f"normcal error: {error}", file=sys.stderr)
        sys.exit(1)
