"""Fixtures of the analysis tests: the real Kineto traces read once per session."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest

import analyze

KINETO_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kineto"


@pytest.fixture(scope="session")
def kineto_db(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], duckdb.DuckDBPyConnection]:
    """``kineto_db(name)``: a read-only connection over the tables of tests/fixtures/kineto/NAME,
    built once per session (in a temporary directory, never beside the fixture)."""
    root = tmp_path_factory.mktemp("kineto-db")
    opened: dict[str, duckdb.DuckDBPyConnection] = {}

    def open_(name: str) -> duckdb.DuckDBPyConnection:
        if name not in opened:
            opened[name] = analyze.open(KINETO_FIXTURES / name, db=root / f"{name}.duckdb")
        return opened[name]

    return open_
