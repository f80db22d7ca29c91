"""Corpora shared by API tests: five documents with one query each, a scifact slice."""

from __future__ import annotations

from typing import Any

CORPUS = {
    "aspirin": "Aspirin lowers the risk of heart attack in older adults.",
    "python": "Python is a programming language with dynamic typing.",
    "paris": "Paris is the capital and largest city of France.",
    "photosynthesis": "Plants convert sunlight into chemical energy by photosynthesis.",
    "faiss": "FAISS is a library for efficient similarity search of dense vectors.",
}
QUERIES = {
    "aspirin": "Does aspirin prevent heart attacks?",
    "python": "Which programming language is dynamically typed?",
    "paris": "What is the capital of France?",
    "photosynthesis": "How do plants make energy from light?",
    "faiss": "library for nearest neighbour vector search",
}


def scifact_slice(
    n_queries: int, n_distractors: int
) -> tuple[list[dict[str, Any]], list[str], list[dict[str, Any]]]:
    """A real slice of scifact: the first ``n_queries`` train queries with qrels.

    Returns the documents (every relevant one of those queries, then the first
    ``n_distractors`` others), the query texts and their judgments, both in query
    order. Skips the test when the dataset is not staged (``shared_dataset``).
    """
    from app.cli.inputs import read_corpus, read_qrels, read_queries
    from tests.conftest import shared_dataset

    path = shared_dataset("scifact")
    qrels = read_qrels(path, "train")
    texts = read_queries(path)
    qids = sorted(qrels)[:n_queries]
    relevant = {d for q in qids for d in qrels[q]}
    docs, distractors = [], 0
    for doc in read_corpus(path):
        if doc["id"] in relevant:
            docs.append(doc)
        elif distractors < n_distractors:
            docs.append(doc)
            distractors += 1
    judgments = [
        {"query": texts[q], "document_id": d, "relevance": r}
        for q in qids
        for d, r in qrels[q].items()
    ]
    return docs, [texts[q] for q in qids], judgments
