"""Milvus connection settings: layout, database name and TLS (pure validation, no Milvus)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from app.cli.main import main
from app.settings import Settings

HTTPS = "https://milvus.example:19530"


def milvus(**values: Any) -> Settings:
    return Settings(storage="milvus", **values)


@pytest.fixture
def pems(tmp_path: Path) -> dict[str, Path]:
    """CA, client certificate and key files (their content is pymilvus's to read)."""
    files = {k: tmp_path / f"{k}.pem" for k in ("ca", "cert", "key")}
    for path in files.values():
        path.write_text("-----BEGIN CERTIFICATE-----\n")
    return files


def test_the_default_layout_is_per_collection_and_shared_is_chosen_by_name():
    assert milvus().milvus_layout == "per-collection"
    assert milvus(milvus_layout="shared").milvus_layout == "shared"
    with pytest.raises(ValidationError, match="milvus_layout"):
        milvus(milvus_layout="pooled")


def test_the_database_name_is_passed_and_checked_at_its_bound():
    assert "db_name" not in milvus().milvus_options()
    assert milvus(milvus_db="tenants_1").milvus_options() == {"db_name": "tenants_1"}
    longest = "d" * 255
    assert milvus(milvus_db=longest).milvus_db == longest
    for bad in ("d" * 256, "1st", "a-b", "a b", "ü"):
        with pytest.raises(ValidationError, match="milvus_db"):
            milvus(milvus_db=bad)


def test_one_way_tls_passes_the_ca_as_the_server_root(pems: dict[str, Path]):
    settings = milvus(
        milvus_uri=HTTPS, milvus_tls_ca=pems["ca"], milvus_tls_server_name="milvus"
    )
    assert settings.milvus_options() == {
        "secure": True,
        "server_name": "milvus",
        "server_pem_path": str(pems["ca"]),
    }
    assert milvus(milvus_uri=HTTPS).milvus_options() == {"secure": True}


def test_mutual_tls_passes_the_ca_certificate_and_key(pems: dict[str, Path]):
    settings = milvus(
        milvus_uri=HTTPS,
        milvus_tls_ca=pems["ca"],
        milvus_tls_client_cert=pems["cert"],
        milvus_tls_client_key=pems["key"],
    )
    assert settings.milvus_options() == {
        "secure": True,
        "ca_pem_path": str(pems["ca"]),
        "client_pem_path": str(pems["cert"]),
        "client_key_path": str(pems["key"]),
    }


def test_incomplete_or_pointless_tls_is_refused(pems: dict[str, Path]):
    cases: list[tuple[dict[str, Any], str]] = [
        ({"milvus_tls_ca": pems["ca"]}, "needs an https://"),  # the default file URI
        (
            {"milvus_uri": "http://h:19530", "milvus_tls_server_name": "h"},
            "needs an https://",
        ),
        (
            {"milvus_uri": HTTPS, "milvus_tls_ca": pems["ca"]}
            | {"milvus_tls_client_cert": pems["cert"]},
            "set both",
        ),
        (
            {"milvus_uri": HTTPS, "milvus_tls_ca": pems["ca"]}
            | {"milvus_tls_client_key": pems["key"]},
            "set both",
        ),
        (
            {"milvus_uri": HTTPS, "milvus_tls_client_cert": pems["cert"]}
            | {"milvus_tls_client_key": pems["key"]},
            "needs NORMCAL_MILVUS_TLS_CA",
        ),
    ]
    for values, message in cases:
        with pytest.raises(ValidationError, match=message):
            milvus(**values)


def test_a_missing_certificate_file_stops_the_server_naming_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    """``normcal serve`` exits 2 with one line, before anything loads."""
    for name, value in {
        "STORAGE": "milvus",
        "MILVUS_URI": HTTPS,
        "MILVUS_TLS_CA": str(tmp_path / "absent.pem"),
        "DATA_DIR": str(tmp_path / "data"),
    }.items():
        monkeypatch.setenv(f"NORMCAL_{name}", value)
    assert main(["serve"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("normcal: invalid settings: NORMCAL_MILVUS_TLS_CA: ")
    assert "does not point to a file" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "data").exists()
