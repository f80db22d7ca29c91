"""Server configurations named on a benchmark's command line, and their CPU time.

A mode is parts joined by ``/``, each optional, in any order: the backend (``torch``,
``onnx``), the precision (``fp32``, ``mixed``, ``bf16``, ``auto``), the threads per forward pass
(``t0``: one per core, as before ``NORMCAL_EMBED_THREADS`` existed; ``t1``), and, for
``benchmarks/load.py``, batching across requests (``off``, or a window in ms). Unnamed
parts keep the server's defaults. ``torch/fp32/t0/0`` is the default of the release
before issue 24.

``noamx`` caps oneDNN's instruction set at ``avx512_core_bf16``
(``ONEDNN_MAX_CPU_ISA``): on a CPU with AMX, the bf16 layers then run the kernels a
CPU with ``avx512_bf16`` but no AMX runs (an AMD EPYC of the Zen 4 generation), to
show their behaviour here. It is not that CPU: its speed, caches and MKL's fp32
paths differ.
"""

from __future__ import annotations

BACKENDS = ("torch", "onnx")
PRECISIONS = ("fp32", "mixed", "bf16", "auto")
NO_AMX = "AVX512_CORE_BF16"  # oneDNN's ISA cap of the noamx part


def mode_env(mode: str, onnx_path: object = None) -> dict[str, str]:
    """The ``NORMCAL_*`` variables of ``mode``; ``onnx_path`` for the onnx backend."""
    env: dict[str, str] = {}
    for part in filter(None, mode.split("/")):
        if part in BACKENDS:
            env["NORMCAL_EMBEDDING_BACKEND"] = part
        elif part in PRECISIONS:
            env["NORMCAL_EMBED_PRECISION"] = part
        elif part.startswith("t") and part[1:].isdigit():
            env["NORMCAL_EMBED_THREADS"] = part[1:]
        elif part == "noamx":
            env["ONEDNN_MAX_CPU_ISA"] = NO_AMX
        elif part == "off":
            env["NORMCAL_EMBED_BATCHING"] = "false"
        elif part.replace(".", "", 1).isdigit():
            env["NORMCAL_EMBED_BATCHING"] = "true"
            env["NORMCAL_EMBED_BATCH_WINDOW_MS"] = part
        else:
            raise SystemExit(f"unknown part {part!r} of mode {mode!r}")
    if env.get("NORMCAL_EMBEDDING_BACKEND") == "onnx" and onnx_path is not None:
        env["NORMCAL_ONNX_PATH"] = str(onnx_path)
    return env


def uses_onnx(modes: list[str]) -> bool:
    """Whether any mode needs the exported graph."""
    return any("onnx" in m.split("/") for m in modes)


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux ``/proc``)."""
    import os

    fields = open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
