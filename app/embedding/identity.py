"""A model's identity, derived from its files rather than from a configured name.

``NORMCAL_MODEL_NAME`` is a label: pointing ``NORMCAL_MODEL_PATH`` at another model
kept it, and with it the old model's collections and calibration profile, whose
cosines and norms mean nothing for the new model. The identity hashes what decides
the vectors: the configs (architecture, module pipeline, pooling), the tokenizer
and the weights the torch backend loads. READMEs and other backends' exports
(``onnx/``, ``openvino/``) are left out: they do not change a vector.
"""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

__all__ = ["IDENTITY_PREFIX", "model_files", "model_identity"]

IDENTITY_PREFIX = "sha256:"
_DIGEST_CHARS = 16  # 64 bits: a label that tells models apart, not a signature
_CHUNK = 1 << 20
_TOP_LEVEL = (
    "config.json",
    "config_sentence_transformers.json",
    "modules.json",
    "sentence_bert_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "merges.txt",
    "vocab.json",
    "sentencepiece.bpe.model",
    "spiece.model",
    "added_tokens.json",
)
_WEIGHTS = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin")

# File digests by (path, size, mtime_ns): the weights are read once per process, and
# every later identity of the same unchanged files costs a stat per file.
_digests: dict[tuple[str, int, int], str] = {}
_digests_lock = threading.Lock()


def model_files(model_dir: Path) -> list[Path]:
    """The files that decide a model's vectors, sorted by path relative to it.

    The module directories come from ``modules.json`` (e.g. ``1_Pooling``), whose
    ``config.json`` holds the pooling mode; without ``modules.json`` the whole
    pipeline is the top-level transformer.
    """
    found = {model_dir / name for name in _TOP_LEVEL}
    for pattern in _WEIGHTS:
        found.update(model_dir.glob(pattern))
    modules = model_dir / "modules.json"
    if modules.is_file():
        for module in json.loads(modules.read_text(encoding="utf-8")):
            sub = str(module.get("path", ""))
            if sub:
                found.update((model_dir / sub).glob("*.json"))
    return sorted(
        (p for p in found if p.is_file()), key=lambda p: p.relative_to(model_dir)
    )


def model_identity(model_path: str | Path) -> str:
    """The identity of the model in ``model_path``: ``sha256:`` and 16 hex digits.

    The hash covers the relative paths and contents of :func:`model_files`, read
    streamed; unchanged files are not read twice in a process.
    """
    model_dir = Path(model_path).resolve()
    files = model_files(model_dir)
    if not files:
        raise ValueError(f"no model files in {model_dir}")
    total = hashlib.sha256()
    for path in files:
        total.update(path.relative_to(model_dir).as_posix().encode())
        total.update(b"\0")
        total.update(_file_digest(path).encode())
        total.update(b"\n")
    return IDENTITY_PREFIX + total.hexdigest()[:_DIGEST_CHARS]


def _file_digest(path: Path) -> str:
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    with _digests_lock:
        cached = _digests.get(key)
    if cached is not None:
        return cached
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    value = digest.hexdigest()
    with _digests_lock:
        _digests[key] = value
    return value
