"""Export a model's transformer to ONNX, and keep the export only while it is valid.

A graph lives in a directory with ``model.onnx`` and ``manifest.json``. The manifest
records the model identity (:mod:`app.embedding.identity`), the versions of torch, onnx
and onnxruntime and the opset it was made with, and the file's sha256. A graph is
used only if all of that matches now: a different model, a new exporter, a truncated
or edited file is rebuilt (or refused where nothing can rebuild it), never trusted.

Export needs torch, transformers and onnx, imported inside :func:`export_onnx` only;
loading a valid cached or pre-exported graph (``NORMCAL_ONNX_PATH``, made by
``normcal export-onnx``) needs none of them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import warnings
from importlib import metadata
from pathlib import Path
from typing import Any

from app.embedding.base import require
from app.embedding.identity import IDENTITY_PREFIX, model_identity

__all__ = [
    "GRAPH",
    "MANIFEST",
    "OnnxExportError",
    "ensure_onnx",
    "export_onnx",
    "valid_export",
]

logger = logging.getLogger(__name__)

GRAPH = "model.onnx"
MANIFEST = "manifest.json"
_FORMAT = 1  # bump when the exported graph's inputs, outputs or export options change
_OPSET = 17
_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
_OUTPUT = "token_embeddings"
_CHUNK = 1 << 20


class OnnxExportError(RuntimeError):
    """No valid graph, and none can be made here (say, torch is not installed)."""


def _version(distribution: str) -> str | None:
    """Installed version, read from metadata (imports nothing)."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _expected(model_id: str) -> dict[str, Any]:
    """What a manifest must say for its graph to be used now."""
    return {
        "format": _FORMAT,
        "model_id": model_id,
        "opset": _OPSET,
        "torch": _version("torch"),
        "onnx": _version("onnx"),
        "onnxruntime": _version("onnxruntime"),
    }


def valid_export(directory: Path, model_id: str) -> str | None:
    """Why the graph in ``directory`` must not be used, or None if it may.

    Exporter versions are compared only where installed: a runtime without torch
    cannot re-export, and accepts any exporter's graph of the right model.
    """
    graph, manifest_file = directory / GRAPH, directory / MANIFEST
    if not graph.is_file() or not manifest_file.is_file():
        return f"no {GRAPH} with {MANIFEST} in {directory}"
    try:
        manifest = json.loads(manifest_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        return f"unreadable {manifest_file}: {error}"
    if not isinstance(manifest, dict):
        return f"{manifest_file} is not an object"
    for key, want in _expected(model_id).items():
        have = manifest.get(key)
        if have != want and not (key in {"torch", "onnx"} and want is None):
            return f"{manifest_file}: {key} is {have!r}, now {want!r}"
    if manifest.get("sha256") != _sha256(graph):
        return f"{graph} does not match the sha256 in its manifest (corrupt or edited)"
    return None


def export_onnx(model_path: str | Path, out_dir: Path) -> Path:
    """Export the transformer of the model in ``model_path`` to ``out_dir``.

    The graph takes ``input_ids``, ``attention_mask`` and ``token_type_ids`` with
    dynamic batch and sequence axes and returns the last hidden state (pooling stays
    in numpy, :func:`app.embedding.onnx_backend.pool`). Files are written to temporary
    names and renamed, the manifest last: a crash leaves no graph that looks valid.
    Returns ``out_dir``.
    """
    require("exporting to ONNX", "torch", "transformers", "onnx")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModel
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    model_dir = Path(model_path).resolve()
    model_id = model_identity(model_dir)
    # Eager attention: a plain masked softmax traces to a graph that is valid for
    # every batch and sequence length (the fused kernels branch on shapes).
    model = AutoModel.from_pretrained(
        str(model_dir), local_files_only=True, attn_implementation="eager"
    ).eval()

    class _LastHiddenState(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(
            self,
            input_ids: torch.Tensor,
            attention_mask: torch.Tensor,
            token_type_ids: torch.Tensor,
        ) -> torch.Tensor:
            out = self.inner(
                input_ids=input_ids,
                attention_mask=attention_mask,
                token_type_ids=token_type_ids,
            )
            return out.last_hidden_state  # type: ignore[no-any-return]

    # Two rows, the second padded, so the traced graph masks padding.
    ids = torch.full((2, 16), 1000, dtype=torch.long)
    mask = torch.ones((2, 16), dtype=torch.long)
    mask[1, 9:] = 0
    types = torch.zeros((2, 16), dtype=torch.long)
    axes = {name: {0: "batch", 1: "sequence"} for name in (*_INPUTS, _OUTPUT)}
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".export-") as tmp:
        staged = Path(tmp) / GRAPH
        # The tracer warns where Python branches on shapes (the mask's padding length,
        # always 0 here) and about index ops; the equivalence test on every length
        # up to max_seq_length is what shows the graph is right.
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                _LastHiddenState(model),
                (ids, mask, types),
                str(staged),
                input_names=list(_INPUTS),
                output_names=[_OUTPUT],
                dynamic_axes=axes,
                opset_version=_OPSET,
                dynamo=False,
            )
        manifest = {**_expected(model_id), "sha256": _sha256(staged)}
        _fsync(staged)
        os.replace(staged, out_dir / GRAPH)
        staged_manifest = Path(tmp) / MANIFEST
        staged_manifest.write_text(json.dumps(manifest, indent=2), encoding="utf-8")
        _fsync(staged_manifest)
        os.replace(staged_manifest, out_dir / MANIFEST)
    logger.info("exported %s (%s) to %s", model_dir, model_id, out_dir / GRAPH)
    return out_dir


def _fsync(path: Path) -> None:
    with path.open("rb") as handle:
        os.fsync(handle.fileno())


def ensure_onnx(
    model_path: str | Path, data_dir: Path, pre_exported: Path | None = None
) -> Path:
    """The path of a valid ``model.onnx`` for the model, exporting one if needed.

    ``pre_exported`` (``NORMCAL_ONNX_PATH``) is used if valid for this model;
    otherwise the cache ``<data_dir>/onnx/<identity>/`` is, and is (re)built when
    missing, stale or corrupt.
    """
    model_id = model_identity(model_path)
    if pre_exported is not None:
        problem = valid_export(pre_exported, model_id)
        if problem is None:
            return pre_exported / GRAPH
        logger.warning("NORMCAL_ONNX_PATH not used: %s", problem)
    cache = data_dir / "onnx" / model_id.removeprefix(IDENTITY_PREFIX)
    problem = valid_export(cache, model_id)
    if problem is None:
        return cache / GRAPH
    if _version("torch") is None or _version("onnx") is None:
        raise OnnxExportError(
            f"no valid ONNX graph for {model_id} ({problem}) and torch/onnx are not "
            "installed to export one: run `normcal export-onnx --out DIR` where they "
            "are and set NORMCAL_ONNX_PATH=DIR"
        )
    logger.info("exporting the model to ONNX: %s", problem)
    export_onnx(model_path, cache)
    problem = valid_export(cache, model_id)
    if problem is not None:  # pragma: no cover - a fresh export always verifies
        raise OnnxExportError(problem)
    return cache / GRAPH
