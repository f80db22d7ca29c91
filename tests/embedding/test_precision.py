"""NORMCAL_EMBED_PRECISION: bf16 or mixed only where native and within the gate, fp32
exact."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from app.api.app import create_app
from app.embedding.base import EmbeddingBatch, forward_passes
from app.embedding.precision import (
    GRAPH_MARGIN,
    PROBES,
    Agreement,
    PrecisionChoice,
    cheaper_graph,
    cpu_bf16_flag,
    select_precision,
)
from app.settings import Settings, default_model_path


def _batch(vectors, norms, n_tokens=None, truncated=None) -> EmbeddingBatch:
    vectors = np.asarray(vectors, dtype=np.float32)
    n = len(vectors)
    return EmbeddingBatch(
        vectors=vectors,
        norms=np.asarray(norms, dtype=np.float64),
        n_tokens=np.asarray(n_tokens if n_tokens is not None else [3] * n, np.int64),
        truncated=np.asarray(truncated if truncated is not None else [False] * n),
    )


# -- pure logic -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ("fpu avx2 avx512f avx512_bf16 avx512_vnni", "avx512_bf16"),
        ("fpu avx512_bf16 amx_bf16 amx_tile", "amx_bf16"),
        ("fpu avx2 avx512f avx512_vnni", None),
    ],
)
def test_the_native_bf16_flag_is_read_from_cpuinfo(tmp_path, flags, expected):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n\nprocessor\t: 1\n")
    assert cpu_bf16_flag(cpuinfo) == expected


def test_no_cpuinfo_means_no_native_bf16(tmp_path):
    assert cpu_bf16_flag(tmp_path / "absent") is None


def test_the_gate_passes_at_its_bounds_and_fails_one_step_past():
    ref = _batch([[1, 0], [0, 1]], [256.0, 4.0])
    at = _batch([[1, 0], [0, 1]], [257.28, 4.0])  # 0.5% exactly (to the last bit)
    assert Agreement.between(ref, at).failure() is None
    past = _batch([[1, 0], [0, 1]], [257.29, 4.0])
    assert "norm moved by 0.504%" in Agreement.between(ref, past).failure()
    angle = np.arccos(0.99989)  # a cosine just below 0.9999
    turned = _batch([[np.cos(angle), np.sin(angle)], [0, 1]], [256.0, 4.0])
    assert "cosine fell" in Agreement.between(ref, turned).failure()
    tokens = _batch([[1, 0], [0, 1]], [256.0, 4.0], n_tokens=[3, 4])
    assert "token counts" in Agreement.between(ref, tokens).failure()
    cut = _batch([[1, 0], [0, 1]], [256.0, 4.0], truncated=[False, True])
    assert "truncation" in Agreement.between(ref, cut).failure()


def test_zero_vectors_agree_with_themselves():
    ref = _batch([[0, 0], [1, 0]], [0.0, 2.0])
    assert Agreement.between(ref, ref).failure() is None


@pytest.mark.parametrize(
    ("costs", "kept"),
    [
        ({"fp32": 10.0, "mixed": 10 * GRAPH_MARGIN}, "mixed"),  # at the margin
        ({"fp32": 10.0, "mixed": 10 * GRAPH_MARGIN + 0.01}, "fp32"),  # one past
        ({"fp32": 8.8, "mixed": 10.6}, "fp32"),  # measured here without AMX
        ({"fp32": 9.3, "mixed": 6.7}, "mixed"),  # and with AMX
        ({"mixed": 9.0, "fp32": 10.0, "bf16": 8.0}, "bf16"),  # the cheapest reduced
        ({"mixed": 12.0}, "mixed"),  # the fp32 graph failed its check
        ({"fp32": 12.0}, "fp32"),  # the reduced graph failed its check
    ],
)
def test_a_reduced_graph_is_kept_only_if_it_costs_a_margin_less_than_fp32(costs, kept):
    assert cheaper_graph(costs) == kept


def test_there_is_no_cheaper_graph_of_none():
    with pytest.raises(ValueError, match="no graph"):
        cheaper_graph({})


class _Recorder:
    """A switchable embedder that records the precision of every call."""

    def __init__(self) -> None:
        self.precision = "bf16"
        self.calls: list[str] = []

    def embed(self, texts, input_type):
        self.calls.append(self.precision)
        return _batch(np.eye(2)[[0] * len(texts)], [1.0] * len(texts))


def test_fp32_forced_and_auto_without_native_bf16_run_no_self_check():
    for setting, native in (("fp32", "CPU flag avx512_bf16"), ("auto", None)):
        embedder = _Recorder()
        choice = select_precision(setting, embedder, native=native)
        assert choice.precision == "fp32" and embedder.precision == "fp32"
        assert embedder.calls == []
    assert "no native bf16" in select_precision("auto", _Recorder(), native=None).reason


# -- the real model -----------------------------------------------------------------


def _model(precision: str):
    """The model as the service loads it (one intra-op thread: ``embed_threads``'s
    default; torch's own, one per core, spins against the other test worker)."""
    from app.embedding import SentenceTransformerEmbedder

    return SentenceTransformerEmbedder(
        default_model_path(), model_name="m", precision=precision, threads=1
    )


@pytest.fixture(scope="module")
def fp32():
    return _model("fp32")


TEXTS = [
    "does aspirin prevent heart attacks?",
    "",
    "Paris is the capital of France.",
    " ".join(["calibration of retrieval scores in RAG systems"] * 60),  # truncated
    "東京は日本の首都である。",
    *PROBES,
]


def test_fp32_forced_gives_the_sentence_transformers_embeddings_bit_for_bit(fp32):
    """What normcal stored before precision was a setting: encode of the model
    without Normalize, pass by pass, token counts from the model's tokenizer."""
    from sentence_transformers import SentenceTransformer

    assert fp32.precision_choice == PrecisionChoice(
        "fp32", "NORMCAL_EMBED_PRECISION=fp32"
    )
    got = fp32.embed(TEXTS, "document")
    model = SentenceTransformer(default_model_path(), device="cpu")
    model = SentenceTransformer(modules=list(model)[:-1], device="cpu")
    full = np.array(
        [len(model.tokenizer(t, truncation=False)["input_ids"]) for t in TEXTS]
    )
    seen = np.minimum(full, fp32.max_seq_length)
    raw = np.empty((len(TEXTS), fp32.dim), dtype=np.float32)
    for rows in forward_passes(seen, fp32.batch_size, fp32.max_batch_tokens):
        raw[rows] = model.encode(
            [TEXTS[i] for i in rows],
            batch_size=len(rows),
            convert_to_numpy=True,
            normalize_embeddings=False,
        )
    expected = EmbeddingBatch.from_pooled(raw, seen, full > fp32.max_seq_length)
    assert expected.truncated.any()
    for field in dataclasses.fields(EmbeddingBatch):
        np.testing.assert_array_equal(
            getattr(got, field.name), getattr(expected, field.name)
        )


class _PoisonedInBf16:
    """The real model, but one probe's norm is 1% off in the ``poisoned`` precisions:
    the injected failure."""

    def __init__(self, inner, poison: str, poisoned=("bf16", "mixed")) -> None:
        self.inner = inner
        self.poison = poison
        self.poisoned = poisoned

    @property
    def precision(self):
        return self.inner.precision

    @precision.setter
    def precision(self, value) -> None:
        self.inner.precision = value

    def embed(self, texts, input_type):
        batch = self.inner.embed(texts, input_type)
        if self.precision in self.poisoned:
            norms = batch.norms.copy()
            norms[texts.index(self.poison)] *= 1.01
            batch = dataclasses.replace(batch, norms=norms)
        return batch


def test_a_failing_self_check_falls_back_to_fp32(fp32):
    poison = "a probe whose bf16 embedding fails the gate"
    wrapped = _PoisonedInBf16(fp32, poison)
    choice = select_precision(
        "auto", wrapped, native="CPU flag avx512_bf16", probes=(*PROBES, poison)
    )
    assert choice.precision == "fp32" and fp32.precision == "fp32"
    assert "bf16 failed its self-check" in choice.reason
    assert "mixed failed its self-check" in choice.reason
    assert "a norm moved by" in choice.reason
    # And the model really runs fp32 again: exactly the fp32 embeddings.
    again = _model("fp32").embed(TEXTS, "query")
    np.testing.assert_array_equal(fp32.embed(TEXTS, "query").vectors, again.vectors)


def test_auto_falls_back_from_bf16_to_mixed_when_only_bf16_fails(fp32):
    poison = "a probe only whose full-bf16 embedding fails the gate"
    wrapped = _PoisonedInBf16(fp32, poison, poisoned=("bf16",))
    try:
        choice = select_precision(
            "auto", wrapped, native="CPU flag avx512_bf16", probes=(*PROBES, poison)
        )
        assert choice.precision == "mixed" and fp32.precision == "mixed"
        assert "bf16 failed its self-check" in choice.reason
        assert "self-check of mixed" in choice.reason
        # mixed really ran: not the fp32 embeddings, and inside the gate.
        ref = _model("fp32").embed(TEXTS, "document")
        got = fp32.embed(TEXTS, "document")
        assert not np.array_equal(ref.vectors, got.vectors)
        assert Agreement.between(ref, got).failure() is None
    finally:
        fp32.precision = "fp32"


def test_forced_bf16_keeps_bf16_and_says_what_the_check_found(fp32):
    poison = "poisoned"
    wrapped = _PoisonedInBf16(fp32, poison)
    try:
        choice = select_precision("bf16", wrapped, native=None, probes=(poison,))
        assert choice.precision == "bf16" and fp32.precision == "bf16"
        assert "NORMCAL_EMBED_PRECISION=bf16" in choice.reason
        assert "max norm error 1.0" in choice.reason
    finally:
        fp32.precision = "fp32"


@pytest.mark.skipif(cpu_bf16_flag() is None, reason="this CPU has no native bf16")
def test_auto_on_a_native_bf16_cpu_follows_its_self_check(auto, fp32):
    reason = auto.precision_choice.reason
    assert f"on {len(PROBES)} probes against fp32" in reason
    ref, got = fp32.embed(TEXTS, "document"), auto.embed(TEXTS, "document")
    if auto.precision != "fp32":  # a gate passed: it really ran, within the gate
        # (this CPU: bf16 moves the Cyrillic probe 0.6%, mixed 0.25%: mixed)
        assert not np.array_equal(ref.vectors, got.vectors)
        assert Agreement.between(ref, got).failure() is None
    else:  # both failed, or the fp32 graph was the cheaper: fp32 to rounding
        assert "mixed failed its self-check" in reason or (
            "texts run a traced fp32 graph, kept by" in reason
        )
        tight = {"max_norm_error": 1e-5, "min_cosine": 0.999999}
        assert Agreement.between(ref, got).failure(**tight) is None


@pytest.mark.parametrize("precision", ["bf16", "mixed"])
def test_reduced_precision_is_refused_for_the_onnx_backend(precision):
    with pytest.raises(
        ValueError, match=f"{precision} needs NORMCAL_EMBEDDING_BACKEND=torch"
    ):
        Settings(embedding_backend="onnx", embed_precision=precision)


def test_version_readyz_and_metrics_show_the_precision_in_use(tmp_path, fp32):
    choice = PrecisionChoice("bf16", "CPU flag avx512_bf16; self-check passed")
    fp32.precision_choice = choice
    try:
        settings = Settings(data_dir=tmp_path / "data", embed_threads=1)
        with TestClient(create_app(settings, embedder=fp32)) as c:
            version = c.get("/version").json()["embedding"]
            ready = c.get("/readyz").json()["embedding"]
            metrics = c.get("/metrics").text
    finally:
        fp32.precision_choice = PrecisionChoice("fp32", "NORMCAL_EMBED_PRECISION=fp32")
    expected = {
        "backend": "torch",
        "precision": "bf16",
        "reason": choice.reason,
        "threads": 1,
    }
    assert version == ready == expected
    [sample] = [
        s
        for family in text_string_to_metric_families(metrics)
        for s in family.samples
        if s.name == "normcal_embedding_precision_info"
    ]
    assert sample.labels == {"precision": "bf16", "reason": choice.reason}


# -- queries through the traced graph (auto, CPU) -----------------------------------


def _lengths_and_batches() -> list[list[str]]:
    """Queries of every token count up to the limit, one per call, then mixed
    batches (padding inside a pass) and a pass past the limit (truncation)."""
    words = "calibration of retrieval scores for rag pipelines".split()
    single = [[" ".join(words * 40)[: 4 * n]] for n in range(0, 200, 7)]
    return [*single, TEXTS, [t for [t] in single[::3]]]


@pytest.fixture(scope="module")
def auto():
    return _model("auto")


@pytest.fixture(scope="module")
def auto_fp32():
    """``auto`` where bf16 is not native: fp32, its texts through an fp32 graph."""
    with pytest.MonkeyPatch.context() as patch:
        from app.embedding import torch_backend

        patch.setattr(torch_backend, "cpu_bf16_flag", lambda: None)
        return _model("auto")


def _graph_agrees(model, fp32, gate: dict[str, float]) -> None:
    """Every length, batch and truncation of :func:`_lengths_and_batches` through
    ``model``'s graph is within ``gate`` of the eager fp32 model."""
    for texts in _lengths_and_batches():
        ref, got = fp32.embed(texts, "query"), model.embed(texts, "query")
        np.testing.assert_array_equal(got.n_tokens, ref.n_tokens)
        np.testing.assert_array_equal(got.truncated, ref.truncated)
        assert Agreement.between(ref, got).failure(**gate) is None, texts


def test_auto_runs_queries_through_a_graph_at_the_chosen_precision(auto, fp32):
    if auto.precision == "fp32":
        pytest.skip(
            "auto kept the fp32 graph here (no native bf16, or it measured cheaper "
            "at start-up): auto_fp32's test covers it"
        )
    assert auto._graph is not None
    assert f"texts run a traced {auto.precision} graph" in (
        auto.precision_choice.reason
    )
    # The reduced precision's gate, as for documents (norms 0.5%, cosine 0.9999).
    _graph_agrees(auto, fp32, {})
    # Not the fp32 graph: bf16 rounding shows.
    got = auto.embed(TEXTS, "query")
    assert Agreement.between(fp32.embed(TEXTS, "query"), got).max_norm_error > 1e-5
    # Documents take the graph too (the model has no prompts).
    np.testing.assert_array_equal(auto.embed(TEXTS, "document").vectors, got.vectors)


@pytest.mark.skipif(cpu_bf16_flag() is None, reason="this CPU has no native bf16")
def test_auto_keeps_the_graph_its_start_up_timing_found_cheaper_and_says_so(
    auto, tmp_path
):
    """Both graphs passed their checks here; which one is cheaper is the CPU's
    (with AMX mixed, without fp32): what was kept follows the figures reported."""
    costs = auto.graph_costs
    assert len(costs) == 2 and "fp32" in costs and {"bf16", "mixed"} & set(costs)
    assert all(ms > 0 for ms in costs.values())
    assert auto.precision == auto.precision_choice.precision == cheaper_graph(costs)
    reason = auto.precision_choice.reason
    figures = ", ".join(f"{p} {ms:.2f}" for p, ms in costs.items())
    assert (
        f"texts run a traced {auto.precision} graph, kept by CPU ms per "
        f"query-shaped pass ({figures}; medians of 5 interleaved rounds"
    ) in reason
    with TestClient(
        create_app(Settings(data_dir=tmp_path / "data"), embedder=auto)
    ) as c:
        embedding = c.get("/version").json()["embedding"]
    assert embedding["precision"] == auto.precision
    assert embedding["reason"] == reason


@pytest.mark.skipif(cpu_bf16_flag() is None, reason="this CPU has no native bf16")
def test_a_reduced_graph_that_fails_its_check_leaves_the_fp32_graph(monkeypatch, fp32):
    import torch

    from app.embedding import torch_backend

    real = torch_backend._frozen_transformer

    def reduced_off(transformer, torch, bf16):
        graph = real(transformer, torch, bf16)
        if not bf16:
            return graph
        return lambda ids, mask, types: graph(ids, mask, types) * 1.006

    monkeypatch.setattr(torch_backend, "_frozen_transformer", reduced_off)
    model = _model("auto")
    assert model.precision == model.precision_choice.precision == "fp32"
    assert model.graph_costs == {}  # one candidate: nothing to time
    reason = model.precision_choice.reason
    assert "graph failed: a norm moved by 0.6" in reason
    assert "texts run a traced fp32 graph; self-check on" in reason
    # The eager layers stay fp32 too, and the graph is fp32 to rounding.
    linears = [m for m in model._model.modules() if isinstance(m, torch.nn.Linear)]
    assert {m.weight.dtype for m in linears} == {torch.float32}
    ref, got = fp32.embed(TEXTS, "query"), model.embed(TEXTS, "query")
    tight = {"max_norm_error": 1e-5, "min_cosine": 0.999999}
    assert Agreement.between(ref, got).failure(**tight) is None


def test_an_fp32_graph_equals_the_eager_model_to_rounding(auto_fp32, fp32):
    assert auto_fp32.precision == "fp32"
    assert "texts run a traced fp32 graph" in auto_fp32.precision_choice.reason
    # fp32 both ways, another kernel order: rounding only.
    _graph_agrees(auto_fp32, fp32, {"max_norm_error": 1e-5, "min_cosine": 0.999999})


@pytest.mark.parametrize(
    ("native", "off_by", "gate"),
    [
        # fp32: 0.1% is inside a reduced precision's gate, outside the graph's.
        (False, 1.001, "gate 0.01%"),
        # A reduced precision's graph: 0.6% is outside its gate.
        (True, 1.006, "gate 0.50%"),
    ],
)
def test_a_traced_graph_that_fails_its_self_check_is_not_used(
    monkeypatch, native, off_by, gate
):
    from app.embedding import torch_backend

    real = torch_backend._frozen_transformer

    def off(transformer, torch, bf16):
        graph = real(transformer, torch, bf16)
        return lambda ids, mask, types: graph(ids, mask, types) * off_by

    monkeypatch.setattr(torch_backend, "_frozen_transformer", off)
    if not native:
        monkeypatch.setattr(torch_backend, "cpu_bf16_flag", lambda: None)
    elif cpu_bf16_flag() is None:
        pytest.skip("no native bf16 on this CPU")
    model = _model("auto")
    assert model._graph is None
    reason = model.precision_choice.reason
    assert "texts run the eager model (the traced " in reason
    assert "graph failed: a norm moved by" in reason
    assert gate in reason
    # Native or not, the fp32 graph was tried, and failed its tighter gate.
    assert "the traced fp32 graph failed" in reason and "gate 0.01%" in reason


def test_queries_through_the_graph_from_several_threads_are_the_sequential_ones(auto):
    from concurrent.futures import ThreadPoolExecutor

    queries = [t for [t] in _lengths_and_batches()[:-2]]
    alone = [auto.embed([q], "query").vectors[0] for q in queries]
    with ThreadPoolExecutor(4) as pool:
        together = list(
            pool.map(lambda q: auto.embed([q], "query").vectors[0], queries * 3)
        )
    np.testing.assert_array_equal(np.array(together), np.array(alone * 3))


def test_forced_precisions_run_no_graph(fp32):
    assert fp32._graph is None
    assert "graph" not in fp32.precision_choice.reason


def test_a_pipeline_other_than_transformer_pooling_runs_queries_eager(monkeypatch):
    from app.embedding import torch_backend
    from app.embedding.onnx_backend import UnsupportedModelError

    def unsupported(model_dir):
        raise UnsupportedModelError(f"{model_dir} has a Dense module")

    monkeypatch.setattr(torch_backend.PipelineConfig, "read", unsupported)
    model = _model("auto")
    assert model._graph is None
    assert "texts run the eager model (its pipeline is not" in (
        model.precision_choice.reason
    )


def test_graph_passes_run_at_widths_in_steps_of_eight_up_to_the_limit(auto):
    from app.embedding.torch_backend import WIDTH_STEP

    if auto._graph is None:
        pytest.skip("no graph on this machine")
    limit = auto.max_seq_length
    widths = {auto._width(n) for n in range(1, limit + 1)}
    assert all(w % WIDTH_STEP == 0 or w == limit for w in widths)
    assert max(widths) == limit and len(widths) == -(-limit // WIDTH_STEP)
    assert [auto._width(n) for n in (1, 8, 9, 16, 17)] == [8, 8, 16, 16, 24]
    assert f"{len(widths)} pass widths warmed" in auto.precision_choice.reason


# A child process: the model as the service loads it, then a query of every token
# count up to the limit, each seen for the first time. oneDNN logs each kernel it
# builds ("create:cache_miss") on stdout; C's buffer is flushed at the marker so the
# start-up's lines come before it.
_COLD_QUERIES = """
import ctypes, sys
from app.embedding import SentenceTransformerEmbedder
from app.settings import default_model_path

model = SentenceTransformerEmbedder(
    default_model_path(), model_name="m", precision="auto", threads=1
)
libc = ctypes.CDLL(None)
libc.fflush(None)
print("GRAPH" if model._graph is not None else "EAGER", flush=True)
words = "calibration of retrieval scores for rag pipelines".split()
for n in range(model.max_seq_length + 8):
    model.embed([" ".join(words[i % 7] for i in range(n))], "query")
libc.fflush(None)
print("DONE", flush=True)
"""


@pytest.mark.slow
def test_after_start_up_a_query_of_any_length_builds_no_kernel(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "ONEDNN_VERBOSE": "all", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _COLD_QUERIES],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path(__file__).resolve().parents[2],
        timeout=600,
        check=True,
    )
    lines = done.stdout.splitlines()
    marker = next(i for i, line in enumerate(lines) if line in ("GRAPH", "EAGER"))
    if lines[marker] == "EAGER":
        pytest.skip("no graph on this machine")
    built_at_start = [line for line in lines[:marker] if "create:cache_miss" in line]
    built_later = [line for line in lines[marker:] if "create:cache_miss" in line]
    assert lines[-1] == "DONE"
    assert built_at_start  # oneDNN logs here: the check below could fail
    assert built_later == []
