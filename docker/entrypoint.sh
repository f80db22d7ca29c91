#!/bin/sh
# Container entrypoint: serve normcal. All configuration is NORMCAL_* environment
# (NORMCAL_DATA_DIR, NORMCAL_API_KEY, ...; see docker/normcal.env.example); this
# script only maps NORMCAL_HOST / NORMCAL_PORT to the CLI flags. `exec` makes the
# server PID 1's process, so `docker stop` (SIGTERM) shuts it down gracefully.
set -eu
exec normcal serve --host "${NORMCAL_HOST:-0.0.0.0}" --port "${NORMCAL_PORT:-8000}" "$@"
