"""The sentence-transformers (PyTorch) backend, with the model's ``Normalize`` removed.

For all-MiniLM-L6-v2 the raw norm is the length of the mean-pooled token embedding.
torch and sentence-transformers are imported when a model is loaded, not when this
module is, so importing :mod:`app.embedding` stays cheap. The model runs in fp32, in
bf16 under ``torch.autocast``, or mixed: its feed-forward layers in bf16, the rest fp32
(:mod:`app.embedding.precision` chooses).

With ``auto`` precision on a CPU, every text takes a faster path: the transformer
traced once at start-up into a frozen TorchScript graph at the chosen precision (its
feed-forward layers in bf16 when mixed), its output pooled here as
sentence-transformers' ``Pooling`` does. A short query spends most of its eager pass
in Python and in small matrix products, which the graph runs in about half the CPU
time; an abstract costs about a fifth less (docs/performance.md). A graph is used
only if its probes pass its precision's gate against the eager fp32 pipeline: a
reduced precision's gate, or one 50 times tighter for fp32 (where only the order of
summation differs). Where a reduced precision was chosen, an fp32 graph is traced
too and both are timed on query-shaped passes: the reduced one is kept only if it
is measurably cheaper (:func:`~app.embedding.precision.cheaper_graph`; without AMX
it is not), and ``precision`` is then the kept graph's.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
import os
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from app.embedding.base import EmbeddingBatch, InputType, forward_passes, require
from app.embedding.identity import model_identity
from app.embedding.onnx_backend import PipelineConfig, UnsupportedModelError, pool
from app.embedding.precision import (
    GRAPH_MARGIN,
    PROBES,
    Agreement,
    Precision,
    PrecisionChoice,
    PrecisionSetting,
    cheaper_graph,
    cpu_bf16_flag,
    select_precision,
)
from app.embedding.tokens import Tokenised, padded, pooled_in_passes, truncating

if TYPE_CHECKING:
    from tokenizers import Encoding

logger = logging.getLogger(__name__)

# The graph's passes are padded to a width that is a multiple of this many tokens
# (never past the model's limit), and every such width is run once at start-up. A
# new matrix shape makes oneDNN build and JIT-compile kernels for the bf16 layers
# and GELU (about 2 ms for a one-query pass here, more on a CPU without AMX), so a
# query of a length not seen yet paid that on top of its pass: the cold search tail
# (docs/performance.md). Rounding leaves 32 widths up to 256 tokens instead of 256,
# few enough to build them all before the first request.
WIDTH_STEP = 8
# Interleaved rounds timed per candidate graph at start-up (``_graph_costs``), on
# the probes of at most this many tokens: the shape of a search's query.
TIMED_ROUNDS = 5
QUERY_TOKENS = 32


class SentenceTransformerEmbedder:
    """A sentence-transformers model with its ``Normalize`` module removed.

    Parameters
    ----------
    model_path : str
        Local model directory (no hub download: ``HF_HUB_OFFLINE=1`` is forced).
    model_name : str
        Name reported in responses.
    prompts : dict
        Prefix per input type, e.g. ``{"query": "query: ", "document": "passage: "}``.
    batch_size : int
        Most texts per forward pass (see :func:`~app.embedding.base.forward_passes`).
    max_batch_tokens : int
        Most padded tokens per forward pass.
    device : str
        Torch device.
    threads : int
        torch intra-op threads (process-wide); 0 leaves torch's default (one per core).
    precision : {"auto", "fp32", "mixed", "bf16"}
        See :func:`~app.embedding.precision.select_precision`; ``precision_choice``
        holds what was chosen and why. ``auto`` on a CPU also runs every text through a
        traced graph where it passes its self-check (see the module docstring);
        a forced precision runs the eager model for every text.
    """

    def __init__(
        self,
        model_path: str,
        *,
        model_name: str,
        prompts: dict[InputType, str] | None = None,
        batch_size: int = 32,
        max_batch_tokens: int = 512,
        device: str = "cpu",
        threads: int = 0,
        precision: PrecisionSetting = "fp32",
    ) -> None:
        require(
            "NORMCAL_EMBEDDING_BACKEND=torch",
            "torch",
            "transformers",
            "sentence_transformers",
        )
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        from sentence_transformers import SentenceTransformer
        from sentence_transformers.models import Normalize
        from transformers.utils import logging as transformers_logging

        # transformers draws a "Loading weights" tqdm bar on stderr, the service's log
        # stream (one JSON object per line by default). The model is local, so the
        # library's bars (downloads, loading) have nothing to tell.
        transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
        model = SentenceTransformer(model_path, device=device, local_files_only=True)
        modules = list(model)
        if modules and isinstance(modules[-1], Normalize):
            # Keep the pooled vector's length: rebuild the pipeline without Normalize.
            model = SentenceTransformer(modules=modules[:-1], device=device)
        if threads:
            torch.set_num_threads(threads)
        self._model = model
        self._device = torch.device(device)
        self.model_name = model_name
        self.model_id = model_identity(model_path)
        self.prompts: dict[InputType, str] = dict(prompts or {})
        self.batch_size = batch_size
        self.max_batch_tokens = max_batch_tokens
        self.max_seq_length = int(model.max_seq_length or 512)
        # ``encode`` sets truncation and padding on the model's tokenizer on every
        # call from any pool thread; counting needs its own, configured once.
        self._tokenizer = truncating(
            model.tokenizer.backend_tokenizer, self.max_seq_length
        )
        get_dim = getattr(model, "get_embedding_dimension", None) or (
            model.get_sentence_embedding_dimension
        )
        dim = get_dim()
        if dim is None:  # pragma: no cover - every pooled model reports it
            raise ValueError(f"model at {model_path} does not report its dimension")
        self.dim = int(dim)
        self.precision: Precision = "fp32"
        self._pad_id = int(model.tokenizer.pad_token_id or 0)
        self._graph: Any = None
        for layer in _bf16_layers(model, "mixed", torch).values():
            layer.forward = self._mixed(layer, torch)
        # Measured CPU ms per query-shaped pass of each traced graph timed at
        # start-up (empty where none was): what ``auto`` chose the graph by.
        self.graph_costs: dict[Precision, float] = {}
        self.precision_choice = select_precision(
            precision, self, native=self._native_bf16()
        )
        if precision == "auto" and self._device.type == "cpu":
            graph_note = self._trace_graph(model_path, torch)
            self.precision_choice = PrecisionChoice(
                self.precision, f"{self.precision_choice.reason}; {graph_note}"
            )
        chosen = self.precision_choice.precision
        # Autocast casts every Linear weight to bf16 on each call (its cache lives as
        # long as one autocast block), as mixed does its layers'; cast them once
        # instead. The result is bit for bit the same, and a query costs ~7% less
        # CPU. Norms, softmax and pooling stay fp32, as autocast keeps them.
        for layer in _bf16_layers(model, chosen, torch).values():
            layer.to(torch.bfloat16)

    def _trace_graph(self, model_path: str, torch: Any) -> str:
        """Trace the transformer at the chosen precision and in fp32, gated, timed.

        Each graph is a candidate if it passes its precision's gate against eager
        fp32; of two, :func:`cheaper_graph` keeps one by their measured CPU time
        (:meth:`_graph_costs`), and ``precision`` becomes the kept graph's. Runs
        before the eager model's layers are cast. Returns what was done, for
        ``precision_choice``'s reason (and the log).
        """
        try:
            self._pooling = PipelineConfig.read(Path(model_path)).pooling
        except UnsupportedModelError:
            return (
                "texts run the eager model (its pipeline is not Transformer, Pooling)"
            )
        chosen = self.precision
        self.precision = "fp32"
        reference = self.embed(list(PROBES), "query")
        graphs: dict[Precision, Any] = {}
        checks: dict[Precision, str] = {}
        failures: list[str] = []
        for precision in dict.fromkeys((chosen, "fp32")):
            started = time.perf_counter()
            self._graph = _frozen_transformer(
                self._model[0].auto_model,
                torch,
                bf16=set(_bf16_layers(self._model, precision, torch)),
            )
            agreement = Agreement.between(reference, self.embed(list(PROBES), "query"))
            # In fp32 only the kernels' order of summation differs, so the gate is
            # far tighter than a reduced precision's (a masking error would pass that).
            tight = {"max_norm_error": 1e-4, "min_cosine": 0.99999}
            failure = agreement.failure(**(tight if precision == "fp32" else {}))
            checks[precision] = (
                f"self-check on {len(PROBES)} probes against the eager fp32 model: "
                f"{agreement} ({time.perf_counter() - started:.2f} s)"
            )
            if failure is None:
                graphs[precision] = self._graph
            else:
                logger.warning(
                    "the traced %s graph is not used: it failed its %s",
                    precision,
                    checks[precision],
                )
                failures.append(f"the traced {precision} graph failed: {failure}")
        self._graph = None
        self.precision = chosen
        if not graphs:
            return f"texts run the eager model ({'; '.join(failures)})"
        timed = ""
        if len(graphs) > 1:
            started = time.perf_counter()
            self.graph_costs = self._graph_costs(graphs, torch)
            kept = cheaper_graph(self.graph_costs)
            costs = ", ".join(f"{p} {ms:.2f}" for p, ms in self.graph_costs.items())
            timed = (
                f", kept by CPU ms per query-shaped pass ({costs}; medians of "
                f"{TIMED_ROUNDS} interleaved rounds, {time.perf_counter() - started:.2f}"
                f" s; a reduced graph only if at most {GRAPH_MARGIN:.0%} of fp32's)"
            )
        else:
            [kept] = graphs
        self.precision, self._graph = kept, graphs[kept]
        warmed = self._warm_widths(torch)
        note = "; ".join(
            [*failures, f"texts run a traced {kept} graph{timed}", checks[kept], warmed]
        )
        logger.info("embedding precision %s, the traced graph's: %s", kept, note)
        return note

    def _graph_costs(
        self, graphs: dict[Precision, Any], torch: Any
    ) -> dict[Precision, float]:
        """Each graph's CPU ms per one-query pass, the median of interleaved rounds.

        A round runs every graph once over the short probes (one pass per width
        they take), in alternating order; a first, untimed round builds their
        kernels. CPU time of this thread (``time.thread_time``): what the pass
        costs, not what a busy neighbour takes from it.
        """
        queries = [
            e
            for e in Tokenised(self._tokenizer, list(PROBES)).encodings
            if len(e.ids) <= QUERY_TOKENS
        ]
        by_width = {self._width(len(e.ids)): e for e in queries}
        passes = [
            tuple(torch.from_numpy(a) for a in padded([e], self._pad_id, width=w))
            for w, e in sorted(by_width.items())
        ]
        rounds: dict[Precision, list[float]] = {p: [] for p in graphs}
        order = list(graphs)
        with torch.inference_mode():
            for index in range(TIMED_ROUNDS + 1):
                for precision in order if index % 2 else order[::-1]:
                    started = time.thread_time()
                    for inputs in passes:
                        graphs[precision](*inputs)
                    if index:
                        rounds[precision].append(time.thread_time() - started)
        return {p: 1000 * float(np.median(r)) / len(passes) for p, r in rounds.items()}

    def _width(self, longest: int) -> int:
        """The width a pass whose longest text has ``longest`` tokens runs at."""
        rounded = -(-longest // WIDTH_STEP) * WIDTH_STEP
        return min(rounded, max(longest, self.max_seq_length))

    def _warm_widths(self, torch: Any) -> str:
        """Run the graph once at every width a one-text pass can have.

        oneDNN keeps the kernels it built per shape in its primitive cache (1,024
        by default, ``ONEDNN_PRIMITIVE_CACHE_CAPACITY``), so a lone query never
        builds one. Returns what was done, for the reason.
        """
        started = time.perf_counter()
        widths = sorted({self._width(n) for n in range(1, self.max_seq_length + 1)})
        with torch.inference_mode():
            for width in widths:
                ids = torch.full((1, width), self._pad_id, dtype=torch.long)
                self._graph(ids, torch.ones_like(ids), torch.zeros_like(ids))
        took = time.perf_counter() - started
        return f"{len(widths)} pass widths warmed ({took:.2f} s)"

    def _graph_forward(self, encodings: list[Encoding]) -> NDArray[np.float64]:
        """Pad one pass, run the traced graph, pool (in numpy, as the onnx backend).

        The pass is padded to its :meth:`_width` (masked, so no text changes).
        """
        import torch

        width = self._width(max(len(e.ids) for e in encodings))
        ids, mask, types = padded(encodings, self._pad_id, width=width)
        with torch.inference_mode():
            tokens = self._graph(
                torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(types)
            )
        return pool(tokens.numpy(), mask, self._pooling)

    def _mixed(self, layer: Any, torch: Any) -> Any:
        """``layer``'s forward, in bf16 when the model runs mixed."""
        fp32_forward = layer.forward
        bf16 = torch.bfloat16

        def forward(x: Any) -> Any:
            if self.precision != "mixed":
                return fp32_forward(x)
            bias = None if layer.bias is None else layer.bias.to(bf16)
            out = torch.nn.functional.linear(x.to(bf16), layer.weight.to(bf16), bias)
            return out.float()

        return forward

    def token_counts(self, texts: list[str]) -> NDArray[np.int64]:
        """Tokens the model sees, special tokens included (thread-safe)."""
        return Tokenised(self._tokenizer, texts).lengths

    def _native_bf16(self) -> str | None:
        """Where bf16 is native for this device, or None."""
        import torch

        if self._device.type == "cuda":
            ok = torch.cuda.is_bf16_supported()
            return f"GPU {torch.cuda.get_device_name(self._device)}" if ok else None
        if self._device.type == "cpu":
            flag = cpu_bf16_flag()
            return f"CPU flag {flag}" if flag else None
        return None

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.precision != "bf16":
            return contextlib.nullcontext()
        import torch

        return torch.autocast(self._device.type, dtype=torch.bfloat16)

    def embed(self, texts: list[str], input_type: InputType) -> EmbeddingBatch:
        """Embed texts; see :class:`EmbeddingBatch`."""
        prefix = self.prompts.get(input_type, "")
        inputs = [prefix + t for t in texts] if prefix else list(texts)
        if self._graph is not None:
            return pooled_in_passes(
                self._tokenizer,
                inputs,
                self.dim,
                self.batch_size,
                self.max_batch_tokens,
                self._graph_forward,
            )
        if not inputs:
            return EmbeddingBatch.empty(self.dim)
        tokens = Tokenised(self._tokenizer, inputs)
        raw = np.empty((len(inputs), self.dim), dtype=np.float32)
        passes = forward_passes(tokens.lengths, self.batch_size, self.max_batch_tokens)
        with self._autocast():
            for rows in passes:
                raw[rows] = self._model.encode(
                    [inputs[i] for i in rows],
                    batch_size=len(rows),
                    convert_to_numpy=True,
                    normalize_embeddings=False,
                    show_progress_bar=False,
                )
        return EmbeddingBatch.from_pooled(raw, tokens.lengths, tokens.truncated)


def _bf16_layers(model: Any, precision: Precision, torch: Any) -> dict[str, Any]:
    """The transformer's Linear layers ``precision`` runs in bf16, by name.

    mixed: its feed-forward layers, the Linear layers that are not square (attention's
    query, key, value and output projections map the model's width onto itself; the
    feed-forward block widens it 4x and narrows it back); bf16: every Linear layer;
    fp32: none. Layers after the transformer (a ``Dense`` projection of some models)
    are left alone. Names are relative to the transformer's ``auto_model``.
    """
    if precision == "fp32":
        return {}
    return {
        name: module
        for name, module in model[0].auto_model.named_modules()
        if isinstance(module, torch.nn.Linear)
        and (precision == "bf16" or module.in_features != module.out_features)
    }


def _frozen_transformer(transformer: Any, torch: Any, bf16: set[str]) -> Any:
    """A frozen TorchScript graph of a copy of ``transformer``.

    It runs in fp32 but for the Linear layers named in ``bf16``, which run as mixed
    precision runs them (bf16 inputs and weights, fp32 output). Its inputs are token
    ids, attention mask and token type ids (ignored by models that take none); its
    output the last hidden state. Traced on two rows, the second padded, so that the
    graph masks padding; the self-check is what shows that it is right for other
    shapes.
    """
    model = copy.deepcopy(transformer).float().eval()
    for module in model.modules():  # the copy's own forward, not mixed's wrapper
        module.__dict__.pop("forward", None)
    takes_types = "token_type_ids" in inspect.signature(model.forward).parameters

    class _Bf16Linear(torch.nn.Module):  # type: ignore[misc]
        """``linear`` with bf16 weights and inputs, its output back in fp32."""

        def __init__(self, linear: Any) -> None:
            super().__init__()
            self.linear = linear.to(torch.bfloat16)

        def forward(self, x: Any) -> Any:
            return self.linear(x.to(torch.bfloat16)).float()

    for name in bf16:
        parent, _, child = name.rpartition(".")
        owner = model.get_submodule(parent)
        setattr(owner, child, _Bf16Linear(getattr(owner, child)))

    class _LastHiddenState(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, ids: Any, mask: Any, types: Any) -> Any:
            extra = {"token_type_ids": types} if takes_types else {}
            out = self.inner(input_ids=ids, attention_mask=mask, **extra)
            return out.last_hidden_state

    ids = torch.full((2, 16), 1000, dtype=torch.long)
    mask = torch.ones((2, 16), dtype=torch.long)
    mask[1, 9:] = 0
    types = torch.zeros((2, 16), dtype=torch.long)
    with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
        # The tracer warns where Python branches on shapes (the mask's padding
        # length); the self-check covers the shapes that matter.
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(_LastHiddenState().eval(), (ids, mask, types))
        # Frozen only: optimize_for_inference's oneDNN rewrite of the bf16 layers
        # moved norms by up to 0.54% on benchmarks/onnx_equivalence.py's texts,
        # against 0.37% for the eager model and for this graph, at the same speed.
        return torch.jit.freeze(traced)
