"""Which precision the model runs in: bf16 where it is native and passes a gate, else fp32.

bf16 matrix products cost about two thirds of fp32 ones on a CPU with native bf16
instructions (``avx512_bf16``, ``amx_bf16``), and can be slower than fp32 on one
without. Rounding moves the norms a little; the shipped calibration profiles were
fitted on fp32 embeddings, so bf16 is used only when a self-check at start-up shows
that it changes nothing that matters on a fixed set of probe texts (:data:`PROBES`:
queries, an abstract, texts past the token limit, non-Latin scripts): every norm
within 0.5% (relative), every cosine at least 0.9999, token counts and truncation
identical (:class:`Agreement`).

Three levels, cheapest first: ``bf16`` (every matrix product, under autocast),
``mixed`` (only the feed-forward layers, about two thirds of a transformer's
products; attention, whose softmax magnifies rounding, stays fp32) and ``fp32``.
``auto`` takes the cheapest that passes the self-check, and logs why. Where a backend
then runs a traced graph, nominal capability is not cost: a native bf16 flag does not
say which kernels run (oneDNN without AMX, capped by ``ONEDNN_MAX_CPU_ISA``, or a
hypervisor's), and without AMX the bf16 layers' conversions cost more than they save.
:func:`cheaper_graph` keeps the reduced graph only if its measured CPU time is lower
by a margin. This module loads no model library.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import numpy as np

from app.embedding.base import EmbeddingBatch, InputType

__all__ = [
    "BF16_FLAGS",
    "GRAPH_MARGIN",
    "PROBES",
    "Agreement",
    "Precision",
    "PrecisionChoice",
    "PrecisionSetting",
    "cheaper_graph",
    "cpu_bf16_flag",
    "precision_of",
    "select_precision",
]

logger = logging.getLogger(__name__)

Precision = Literal["fp32", "mixed", "bf16"]
PrecisionSetting = Literal["auto", "fp32", "mixed", "bf16"]
# What ``auto`` tries where bf16 is native, cheapest first.
REDUCED: tuple[Precision, ...] = ("bf16", "mixed")
BF16_FLAGS = ("amx_bf16", "avx512_bf16")
MAX_NORM_ERROR = 0.005  # relative
MIN_COSINE = 0.9999
# A reduced-precision graph is kept only if it costs at most this fraction of the
# fp32 graph's CPU time: rounding must buy a margin that repeated start-ups' noise
# does not flip (docs/performance.md: 0.80-0.83 with AMX, 1.11-1.17 without, here).
GRAPH_MARGIN = 0.95

_ABSTRACT = (
    "Alterations of the architecture of cerebral white matter in the developing human "
    "brain can affect cortical development and result in functional disabilities. A "
    "line scan diffusion-weighted magnetic resonance imaging sequence with diffusion "
    "tensor analysis was applied to measure the apparent diffusion coefficient, to "
    "calculate relative anisotropy, and to delineate three-dimensional fiber "
    "architecture in cerebral white matter in preterm and full-term infants."
)
# Fixed, varied, and cheap: a few short queries, one abstract, three texts past the
# 256-token limit (Latin, CJK, Cyrillic), and scripts whose tokens are mostly unknown
# or split into many word pieces.
PROBES: tuple[str, ...] = (
    "",
    "x",
    "does aspirin prevent heart attacks?",
    "what is the capital of France",
    "0.5 mg/kg IV q6h vs. 1 g PO — p < 0.001 (n = 42) 🙂",
    _ABSTRACT,
    " ".join([_ABSTRACT] * 4),
    "東京は日本の首都であり、世界最大級の都市圏を形成している。" * 12,
    # Cyrillic past the limit: where bf16 strays furthest on the benchmark's texts
    # (benchmarks/onnx_equivalence.py: up to 0.9% on Russian, at most 0.31% on Latin).
    " ".join(
        "столица Франции сколько жителей город река врач болезнь сердце риск лечение".split()
        * 10
    ),
    "糖尿病患者的心血管风险评估",
    "Какова столица Франции и сколько там жителей?",
    "Η ασπιρίνη μειώνει τον κίνδυνο καρδιακής προσβολής.",  # noqa: RUF001
    "ما هي عاصمة فرنسا؟",
    "क्या एस्पिरिन दिल के दौरे को रोकती है?",
    "서울은 대한민국의 수도이다.",
)


@dataclass(frozen=True)
class PrecisionChoice:
    """The precision the model runs in and why."""

    precision: Precision
    reason: str


FP32_ONLY = PrecisionChoice("fp32", "this backend runs fp32 only")


def precision_of(embedder: object) -> PrecisionChoice:
    """What ``embedder`` runs in (a backend without a choice runs fp32)."""
    choice = getattr(embedder, "precision_choice", None)
    return choice if isinstance(choice, PrecisionChoice) else FP32_ONLY


@dataclass(frozen=True)
class Agreement:
    """How far one embedding of texts is from a reference embedding of the same."""

    max_norm_error: float
    min_cosine: float
    tokens_equal: bool

    @classmethod
    def between(cls, reference: EmbeddingBatch, other: EmbeddingBatch) -> Agreement:
        """Worst relative norm error and cosine of ``other`` against ``reference``."""
        ref = np.where(reference.norms > 0, reference.norms, 1.0)
        errors = np.abs(other.norms - reference.norms) / ref
        cosines = np.sum(
            reference.vectors.astype(np.float64) * other.vectors, axis=1
        ) / np.maximum(
            np.linalg.norm(reference.vectors, axis=1)
            * np.linalg.norm(other.vectors, axis=1),
            1e-12,
        )
        both_zero = (reference.norms == 0) & (other.norms == 0)
        cosines = np.where(both_zero, 1.0, cosines)
        return cls(
            max_norm_error=float(errors.max(initial=0.0)),
            min_cosine=float(cosines.min(initial=1.0)),
            tokens_equal=bool(
                np.array_equal(reference.n_tokens, other.n_tokens)
                and np.array_equal(reference.truncated, other.truncated)
            ),
        )

    def failure(
        self, max_norm_error: float = MAX_NORM_ERROR, min_cosine: float = MIN_COSINE
    ) -> str | None:
        """Why this agreement fails the gate, or None if it passes."""
        problems = []
        if not self.max_norm_error <= max_norm_error:
            problems.append(
                f"a norm moved by {self.max_norm_error:.3%} (gate {max_norm_error:.2%})"
            )
        if not self.min_cosine >= min_cosine:
            problems.append(
                f"a cosine fell to {self.min_cosine:.6f} (gate {min_cosine})"
            )
        if not self.tokens_equal:
            problems.append("token counts or truncation differ")
        return "; ".join(problems) or None

    def __str__(self) -> str:
        return (
            f"max norm error {self.max_norm_error:.3%}, "
            f"min cosine {self.min_cosine:.6f}"
        )


def cpu_bf16_flag(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The native bf16 flag the CPU reports (Linux ``/proc/cpuinfo``), if any."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.partition(":")[2].split())
            return next((f for f in BF16_FLAGS if f in flags), None)
    return None


def cheaper_graph(
    costs: Mapping[Precision, float], margin: float = GRAPH_MARGIN
) -> Precision:
    """The precision whose traced graph to keep, from its measured costs.

    ``costs`` holds the CPU time per pass of each graph that passed its self-check.
    fp32 (exact, as the shipped profiles were fitted) is kept unless a reduced
    graph costs at most ``margin`` times as much; then the cheapest reduced one.
    """
    if not costs:
        raise ValueError("no graph to choose from")
    reduced = min(
        (p for p in costs if p != "fp32"), key=costs.__getitem__, default=None
    )
    if "fp32" not in costs:
        assert reduced is not None
        return reduced
    if reduced is not None and costs[reduced] <= margin * costs["fp32"]:
        return reduced
    return "fp32"


class SwitchablePrecision(Protocol):
    """An embedder whose precision can be switched (the torch backend)."""

    precision: Precision

    def embed(self, texts: list[str], input_type: InputType) -> EmbeddingBatch:
        """Embed in the current precision."""
        ...


def select_precision(
    setting: PrecisionSetting,
    embedder: SwitchablePrecision,
    *,
    native: str | None,
    probes: tuple[str, ...] = PROBES,
) -> PrecisionChoice:
    """Choose the precision for ``setting`` and leave ``embedder`` switched to it.

    ``native`` says where bf16 is native (e.g. ``"CPU flag avx512_bf16"``), None if
    nowhere. ``auto`` runs the self-check only where bf16 is native: ``bf16`` if it
    passes, else ``mixed`` if that passes, else fp32. ``bf16`` or ``mixed`` forced
    still runs the check, to log what it costs in accuracy.
    """
    embedder.precision = "fp32"
    if setting == "fp32":
        return PrecisionChoice("fp32", "NORMCAL_EMBED_PRECISION=fp32")
    if setting == "auto" and native is None:
        return _logged(
            PrecisionChoice(
                "fp32",
                f"no native bf16 here (no {'/'.join(BF16_FLAGS)} CPU flag, "
                "no bf16 GPU)",
            )
        )
    reference = embedder.embed(list(probes), "document")
    failures: list[str] = []
    for precision in REDUCED if setting == "auto" else (setting,):
        started = time.perf_counter()
        embedder.precision = precision
        got = embedder.embed(list(probes), "document")
        agreement = Agreement.between(reference, got)
        check = (
            f"self-check of {precision} on {len(probes)} probes against fp32: "
            f"{agreement} ({time.perf_counter() - started:.2f} s)"
        )
        failure = agreement.failure()
        if setting != "auto":
            if failure is not None:
                logger.warning(
                    "%s forced although its self-check failed: %s", precision, failure
                )
            return _logged(
                PrecisionChoice(
                    precision, f"NORMCAL_EMBED_PRECISION={setting}; {check}"
                )
            )
        if failure is None:
            return _logged(
                PrecisionChoice(precision, "; ".join([f"{native}", *failures, check]))
            )
        failures.append(f"{precision} failed its self-check ({failure}); {check}")
    embedder.precision = "fp32"
    return _logged(PrecisionChoice("fp32", "; ".join(failures)))


def _logged(choice: PrecisionChoice) -> PrecisionChoice:
    logger.info("embedding precision %s: %s", choice.precision, choice.reason)
    return choice
