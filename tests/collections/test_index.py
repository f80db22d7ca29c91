"""VectorIndex, flat and HNSW alike: add, remove, search, restricted to allowed ids."""

from __future__ import annotations

import numpy as np
import pytest

from app.collections.index import VectorIndex
from tests.collections.conftest import DIM, unit_vectors

N = 20
SEQS = np.arange(100, 100 + N, dtype=np.int64)


@pytest.fixture(params=["flat", "hnsw"])
def index(request) -> VectorIndex:
    """N random unit vectors under seqs 100…119 (exhaustive ef_search: N is tiny)."""
    built = VectorIndex(DIM, kind=request.param, hnsw_m=8, ef_search=64)
    built.add(SEQS, unit_vectors(N))
    return built


def test_each_vector_finds_itself_first(index):
    scores, seqs = index.search(unit_vectors(N), k=3)
    assert seqs.shape == scores.shape == (N, 3)
    assert seqs[:, 0].tolist() == SEQS.tolist()
    np.testing.assert_allclose(scores[:, 0], 1.0, atol=1e-5)
    assert (np.diff(scores, axis=1) <= 1e-6).all()  # best first


def test_removed_ids_are_never_returned(index):
    gone = [int(s) for s in SEQS[:5]]
    index.remove(gone)
    index.remove([])  # a no-op
    assert index.size == N - 5
    _, seqs = index.search(unit_vectors(N), k=N)
    returned = set(seqs.ravel().tolist()) - {-1}
    assert returned == set(SEQS[5:].tolist())


def test_allowed_restricts_the_search(index):
    allowed = SEQS[[2, 7, 11]]
    scores, seqs = index.search(unit_vectors(N), k=5, allowed=allowed)
    assert (np.diff(scores[:, :3], axis=1) <= 1e-6).all()
    assert {int(s) for s in seqs[:, :3].ravel()} == set(allowed.tolist())
    assert (seqs[:, 3:] == -1).all() and (scores[:, 3:] == 0).all()
    assert seqs[7, 0] == SEQS[7]  # a query that is an allowed vector finds it first


def test_allowed_and_removed_combine(index):
    index.remove([int(SEQS[2])])
    _, seqs = index.search(unit_vectors(N), k=5, allowed=SEQS[[2, 7]])
    assert set(seqs.ravel().tolist()) == {int(SEQS[7]), -1}


def test_nothing_to_search_pads_with_minus_one(index):
    _, seqs = index.search(unit_vectors(2), k=4, allowed=np.array([], np.int64))
    assert (seqs == -1).all()
    empty = VectorIndex(DIM, kind=index.kind)
    scores, seqs = empty.search(unit_vectors(2), k=4)
    assert (seqs == -1).all() and (scores == 0).all() and seqs.shape == (2, 4)
    scores, seqs = index.search(unit_vectors(2), k=0)
    assert seqs.shape == (2, 0)


def test_k_past_the_size_pads_with_minus_one(index):
    scores, seqs = index.search(unit_vectors(1), k=N + 5)
    assert sorted(seqs[0, :N].tolist()) == SEQS.tolist()
    assert (seqs[0, N:] == -1).all() and (scores[0, N:] == 0).all()


def test_emptied_is_a_new_empty_index_of_the_same_kind(index):
    index.remove([int(SEQS[0])])
    fresh = index.emptied()
    assert (fresh.kind, fresh.dim, fresh.size) == (index.kind, index.dim, 0)
    assert (fresh._hnsw_m, fresh._ef_search) == (8, 64)
    fresh.add(SEQS[:1], unit_vectors(1))
    assert fresh.size == 1 and index.size == N - 1


def test_limit_threads_holds_in_the_pool_thread_it_ran_in():
    """OpenMP counts threads per calling thread: the CPU pool sets FAISS's in each
    of its threads (NORMCAL_EMBED_THREADS), and 0 leaves the library's default."""
    import asyncio

    import faiss

    from app.collections.index import limit_threads
    from app.concurrency import CpuPool

    default = faiss.omp_get_max_threads()
    if default == 1:
        pytest.skip("one core: FAISS's default is already one thread")

    async def threads_seen(pool: CpuPool) -> int:
        return await pool.run(faiss.omp_get_max_threads)

    for setting, expected in ((1, 1), (0, default)):
        pool = CpuPool(1, 4, initializer=lambda s=setting: limit_threads(s))
        try:
            assert asyncio.run(threads_seen(pool)) == expected
        finally:
            pool.shutdown()
