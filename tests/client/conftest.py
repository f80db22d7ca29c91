"""A live server on loopback for the client tests (the real model, shared)."""

from __future__ import annotations

import pytest

from tests.support.live import ThreadServer


@pytest.fixture(scope="module")
def live(tmp_path_factory, embedder):
    from app.api.app import create_app
    from app.settings import Settings

    settings = Settings(data_dir=tmp_path_factory.mktemp("client-data"))
    with ThreadServer(create_app(settings, embedder=embedder)) as server:
        yield server
