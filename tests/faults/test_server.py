"""Fault injection against the serving edge: races in the embedder, slow and idle
clients, connection floods, and API keys that cannot work (issue 10, defects 4, 6, 8).

Server tests run real ``normcal serve`` subprocesses and talk raw sockets to them.
Nothing here sleeps to synchronise: sockets block on the server's answer (with a
generous timeout), threads start together on a barrier, and conditions are polled
with a deadline.
"""

from __future__ import annotations

import threading

import numpy as np

SHORT = ["a cat", "what is the capital of France?", "normcal keeps the raw norm"]
LONG = [" ".join(f"word{i}" for i in range(n)) for n in (300, 700)]  # > 256 tokens


def test_concurrent_embed_and_token_counting_do_not_interfere(embedder):
    """Defect 4: counting tokens (no truncation, no padding) while other threads
    encode made ``embed`` raise "Unable to create tensor"; results must also match."""
    texts = SHORT + LONG + SHORT[:1]
    expected = embedder.embed(texts, "document")
    expected_counts = embedder.token_counts(texts)
    assert expected.truncated.any() and not expected.truncated.all()
    embedders, counters, rounds = 3, 3, 3
    barrier = threading.Barrier(embedders + counters)
    embedded = threading.Event()  # counters keep counting until the embeds are done
    errors: list[BaseException] = []
    batches = []
    counts = []

    def run(work) -> None:
        try:
            barrier.wait(timeout=60)
            work()
        except BaseException as error:  # reported below
            errors.append(error)

    def embed() -> None:
        for _ in range(rounds):
            batches.append(embedder.embed(texts, "document"))

    def count() -> None:
        for _ in range(2000):  # bounded; normally ends when the embeds are done
            counts.append(embedder.token_counts(texts))
            if embedded.is_set():
                return

    embedding = [threading.Thread(target=run, args=(embed,)) for _ in range(embedders)]
    counting = [threading.Thread(target=run, args=(count,)) for _ in range(counters)]
    for thread in embedding + counting:
        thread.start()
    for thread in embedding:
        thread.join(300)
    embedded.set()
    for thread in counting:
        thread.join(300)
    assert not any(t.is_alive() for t in embedding + counting)
    assert errors == []
    assert len(batches) == embedders * rounds and len(counts) >= counters
    for batch in batches:
        np.testing.assert_allclose(batch.vectors, expected.vectors, atol=1e-5)
        np.testing.assert_allclose(batch.norms, expected.norms, rtol=1e-5)
        assert (batch.n_tokens == expected.n_tokens).all()
        assert (batch.truncated == expected.truncated).all()
    for got in counts:
        assert (got == expected_counts).all()
