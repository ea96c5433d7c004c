"""The codec's Parquet writer (traceio/native/parquet.c): what DuckDB reads back is exactly
what was written, at every edge of the delta encoding (empty, one value, partial blocks and
miniblocks, several row groups, full-range 64-bit values whose deltas wrap, deltas of every
bit width, 32-bit columns),
with NULLs and statistics, PLAIN doubles and JSON text. Its reader (parquet_read.c) reads the same files back the same
way, and declines every file it did not write."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pytest

from traceio import codec

pytestmark = pytest.mark.skipif(not codec.available(), reason="native codec not built")


def columns(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    full = rng.integers(-2**63, 2**63 - 1, n, dtype=np.int64, endpoint=True)
    full[:4] = [-2**63, 2**63 - 1, -2**63, 2**63 - 1][:n]  # the widest deltas there are
    return {
        "times": np.cumsum(rng.integers(0, 5000, n)).astype(np.int64),  # what traces hold
        "full": full,
        "maybe": rng.integers(-3, 4, n).astype(np.int64),  # negative: NULL
        "small": rng.integers(-2**31, 2**31 - 1, n, endpoint=True).astype(np.int32),
        "flag": rng.integers(0, 2, n).astype(np.bool_),
        "same": np.full(n, 42, np.int64),  # zero-width miniblocks
        # block k's deltas take up to k % 64 bits: every bit width of the packing
        "widths": np.cumsum(rng.integers(0, 2**63 - 1, n, dtype=np.int64, endpoint=True)
                            >> (63 - np.arange(n) // 128 % 64), dtype=np.int64),
    }


@pytest.mark.parametrize("n", [0, 1, 2, 32, 33, 128, 129, 1000, 1_000_001])
def test_round_trip(n: int, tmp_path: Path) -> None:
    cols = columns(n, n)
    kinds = {"small": "int32", "flag": "bool"}
    spec = [(name, kinds.get(name, "int64"), values, name == "maybe") for name, values in cols.items()]
    path = tmp_path / "t.parquet"
    size = codec.native().write_parquet(str(path), spec, "dltrace test")
    assert size == path.stat().st_size
    con = duckdb.connect()
    types = con.execute(f"describe select * from read_parquet('{path}')").fetchall()
    assert [(t[0], t[1]) for t in types] == [("times", "BIGINT"), ("full", "BIGINT"), ("maybe", "BIGINT"),
                                             ("small", "INTEGER"), ("flag", "BOOLEAN"), ("same", "BIGINT"),
                                             ("widths", "BIGINT")]
    got = con.execute(f"select * from read_parquet('{path}')").fetchnumpy()
    ours = codec.native().read_parquet(str(path), "dltrace test")
    assert [(name, kind) for name, kind, _ in ours] == [(name, kind) for name, kind, _, _ in spec]
    for (name, _, data), (_, _, values, nullable) in zip(ours, spec, strict=True):
        back = np.frombuffer(data, values.dtype)
        assert np.array_equal(back, np.where(values < 0, -1, values) if nullable else values), name
    for name, values in cols.items():
        back = np.ma.getdata(got[name])
        if name == "maybe":
            null = np.ma.getmaskarray(got[name])
            assert np.array_equal(null, values < 0)
            assert np.array_equal(back[~null], values[values >= 0])
        else:
            assert np.array_equal(back, values), name
    if n:  # statistics per row group: DuckDB answers min/max from them and prunes with them
        meta = con.execute(f"""select row_group_id, row_group_num_rows, path_in_schema, stats_min_value::BIGINT,
                                      stats_max_value::BIGINT, stats_null_count from parquet_metadata('{path}')
                               where path_in_schema != 'flag' order by row_group_id, column_id""").fetchall()
        expected = []
        start = 0
        for group in sorted({(m[0], m[1]) for m in meta}):
            for name, values in cols.items():
                if name == "flag":
                    continue
                part = values[start:start + group[1]]
                kept = part[part >= 0] if name == "maybe" else part
                expected.append((*group, name, int(kept.min()) if len(kept) else None,
                                 int(kept.max()) if len(kept) else None, len(part) - len(kept)))
            start += group[1]
        assert meta == expected


@pytest.mark.parametrize("n", [0, 1, 1000, 1_000_001])
def test_float64_columns(n: int, tmp_path: Path) -> None:
    """PLAIN doubles, every bit back (NaN, infinities, -0.0, subnormals), no statistics; the
    codec's own reader declines them (DuckDB reads them)."""
    rng = np.random.default_rng(n)
    values = rng.normal(size=n) * 10.0 ** rng.integers(-300, 300, n)
    values[:8] = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 5e-324, -1e308, 1.5])[:n]
    path = tmp_path / "d.parquet"
    codec.native().write_parquet(str(path), [("i", "int64", np.arange(n, dtype=np.int64), False),
                                             ("x", "float64", values, False)], "dltrace")
    con = duckdb.connect()
    assert con.execute(f"describe select x from read_parquet('{path}')").fetchall()[0][:2] == ("x", "DOUBLE")
    back = con.execute(f"select x from read_parquet('{path}') order by i").fetchnumpy()["x"]
    assert np.array_equal(np.asarray(back, np.float64).view(np.int64), values.view(np.int64))
    if n:
        meta = con.execute(f"select encodings, stats_min_value, stats_null_count from parquet_metadata('{path}') "
                           "where path_in_schema = 'x'").fetchall()
        assert {m[0] for m in meta} == {"PLAIN"} and {m[1] for m in meta} == {None} and {m[2] for m in meta} == {0}
    assert codec.native().read_parquet(str(path), "dltrace") is None


def test_json_columns(tmp_path: Path) -> None:
    """Text whose names are JSON documents: DuckDB reads the column as JSON."""
    path = tmp_path / "j.parquet"
    codec.native().write_parquet(str(path), [("a", "json", np.array([0, 1, -1, 0], np.int32), True,
                                              ('{"x": 1}', "[1, 2]"))], "dltrace")
    con = duckdb.connect()
    assert con.execute(f"describe select a from read_parquet('{path}')").fetchall()[0][:2] == ("a", "JSON")
    assert con.execute(f"select a->>'x' from read_parquet('{path}')").fetchall() == [("1",), (None,), (None,), ("1",)]


def test_bad_columns_are_errors(tmp_path: Path) -> None:
    native = codec.native()
    with pytest.raises(ValueError, match="equal numbers of rows"):
        native.write_parquet(str(tmp_path / "x.parquet"), [("a", "int64", np.zeros(3, np.int64), False),
                                                           ("b", "int64", np.zeros(4, np.int64), False)], "t")
    with pytest.raises(ValueError, match="unknown column kind"):
        native.write_parquet(str(tmp_path / "x.parquet"), [("a", "float", np.zeros(3), False)], "t")
    with pytest.raises(ValueError, match="cannot be nullable"):
        native.write_parquet(str(tmp_path / "x.parquet"), [("a", "float64", np.zeros(3), True)], "t")
    native.write_parquet(str(tmp_path / "x.parquet"), [("a", "float64", np.zeros(0), True)], "t")  # empty: may be
    assert duckdb.execute(f"select count(*) from read_parquet('{tmp_path / 'x.parquet'}')").fetchone() == (0,)
    with pytest.raises(ValueError, match="equal numbers of rows"):  # as many bytes, not as many rows
        native.write_parquet(str(tmp_path / "x.parquet"), [("a", "float64", np.zeros(3), False),
                                                           ("b", "int32", np.zeros(6, np.int32), False)], "t")
    with pytest.raises(OSError, match="no-such-dir"):
        native.write_parquet(str(tmp_path / "no-such-dir" / "x.parquet"),
                             [("a", "int64", np.zeros(3, np.int64), False)], "t")


def test_the_reader_declines_what_it_did_not_write(tmp_path: Path) -> None:
    native = codec.native()
    path = tmp_path / "ours.parquet"
    native.write_parquet(str(path), [("a", "int64", np.arange(1000, dtype=np.int64), False)], "dltrace")
    assert native.read_parquet(str(path), "someone else") is None  # another writer's name
    # its row count from the footer alone, for exactly the files it reads
    assert native.parquet_rows(str(path), "dltrace") == 1000
    assert native.parquet_rows(str(path), "someone else") is None
    duck = tmp_path / "duck.parquet"
    duckdb.execute(f"copy (select range::BIGINT a from range(1000)) to '{duck}' (FORMAT parquet)")
    assert native.read_parquet(str(duck), "dltrace") is None
    assert native.parquet_rows(str(duck), "dltrace") is None
    data = path.read_bytes()
    bad = tmp_path / "bad.parquet"
    for damaged in (data[:-1], data[:20] + data[21:], data[:4] + b"\xff" * 8 + data[12:], b"PAR1PAR1", b""):
        bad.write_bytes(damaged)
        assert native.read_parquet(str(bad), "dltrace") is None
        assert native.parquet_rows(str(bad), "dltrace") in (None, 1000)  # (the footer may be whole)
    # damage anywhere never reads outside the file: it is declined, or (in the packed values,
    # which carry no checksum) read as other numbers
    rng = np.random.default_rng(0)
    for _ in range(300):
        damaged = bytearray(data[:int(rng.integers(len(data) // 2, len(data) + 1))])
        for at in rng.integers(0, len(damaged), int(rng.integers(1, 4))):
            damaged[at] = int(rng.integers(0, 256))
        bad.write_bytes(bytes(damaged) + (b"" if damaged[-4:] == b"PAR1" else data[-8:]))
        got = native.read_parquet(str(bad), "dltrace")
        assert got is None or [(n, k, len(c)) for n, k, c in got] == [("a", "int64", 8000)]
        rows = native.parquet_rows(str(bad), "dltrace")  # the footer alone: never a crash
        assert rows is None or isinstance(rows, int)
    with pytest.raises(OSError, match="missing"):
        native.read_parquet(str(tmp_path / "missing.parquet"), "dltrace")
    with pytest.raises(OSError, match="missing"):
        native.parquet_rows(str(tmp_path / "missing.parquet"), "dltrace")


@pytest.mark.parametrize("n", [0, 1, 1000, 1_000_001])
def test_text_columns(n: int, tmp_path: Path) -> None:
    # text as codes into names (a dictionary page of the names, then the codes): what DuckDB
    # reads is the names, NULL where a nullable code is negative; no min/max statistics (only
    # the null count)
    names = ("allreduce", "", "héllo 'wörld'", "x" * 300)
    rng = np.random.default_rng(n)
    codes = rng.integers(-1, len(names), n).astype(np.int32)
    path = tmp_path / "t.parquet"
    codec.native().write_parquet(str(path), [("i", "int64", np.arange(n, dtype=np.int64), False),
                                             ("op", "text", codes, True, names),
                                             ("src", "text", np.maximum(codes, 0), False, names)], "dltrace")
    con = duckdb.connect()
    assert [(c[0], c[1]) for c in con.execute(f"describe select * from '{path}'").fetchall()] == [
        ("i", "BIGINT"), ("op", "VARCHAR"), ("src", "VARCHAR")]
    got = con.execute(f"select op, src from '{path}' order by i").fetchall()
    assert got == [(names[c] if c >= 0 else None, names[max(c, 0)]) for c in codes.tolist()]
    if n:
        stats = con.execute(f"select sum(stats_null_count), max(stats_min_value) from parquet_metadata('{path}') "
                            "where path_in_schema = 'op'").fetchone()
        assert stats == (int((codes < 0).sum()), None)
        encodings = con.execute(f"select distinct encodings from parquet_metadata('{path}') "
                                "where path_in_schema = 'op'").fetchall()
        assert encodings == [("PLAIN, RLE_DICTIONARY, RLE",)]
    assert codec.native().read_parquet(str(path), "dltrace") is None  # the reader reads numbers only


def test_bad_text_columns_are_errors(tmp_path: Path) -> None:
    native = codec.native()
    codes = np.array([0, 1, 2], np.int32)
    with pytest.raises(ValueError, match="needs a tuple of names"):
        native.write_parquet(str(tmp_path / "x.parquet"), [("op", "text", codes, False)], "t")
    with pytest.raises(ValueError, match="code 2, not one of its 2 names"):
        native.write_parquet(str(tmp_path / "x.parquet"), [("op", "text", codes, False, ("a", "b"))], "t")
    with pytest.raises(ValueError, match="is not nullable"):
        native.write_parquet(str(tmp_path / "x.parquet"), [("op", "text", codes - 1, False, ("a", "b"))], "t")
