"""numpy group-by over integer keys (analyze/tables/groups.py) against pandas' groupby."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analyze.tables.groups import Groups


@pytest.mark.parametrize("spans", [(5, 3, 40), (10**6, 2, 2**40), (2**62, 2**62, 7), (3,)])
def test_groups_are_pandas_groups_in_key_order(spans: tuple[int, ...]) -> None:
    """Narrow keys combine by offsets; keys too wide to multiply into 64 bits (ids of 2^62)
    by their dense codes: either way the groups, their order and their sums are pandas'."""
    rng = np.random.default_rng(len(spans) + spans[0] % 97)
    n = 5000
    keys = [rng.integers(-span // 2, span // 2 + 1, n, dtype=np.int64) if span < 2**40 else
            rng.choice(rng.integers(-(2**62), 2**62, 50, dtype=np.int64), n) for span in spans]
    values = rng.integers(0, 10**12, n, dtype=np.int64)
    g = Groups(*keys)
    names = [f"k{i}" for i in range(len(keys))]
    want = pd.DataFrame(dict(zip(names, keys, strict=True)) | {"v": values}).groupby(names)["v"]
    got_keys = [k[g.rows] for k in keys]
    assert [list(x) for x in got_keys] == [list(want.sum().index.get_level_values(i)) for i in range(len(keys))]
    assert list(g.sum(values)) == list(want.sum()) and list(g.max(values)) == list(want.max())
    assert list(g.size()) == list(want.size()) and len(g) == want.ngroups
    assert all(np.array_equal(k[g.order], np.sort(k, kind="stable")) for k in keys[:1])


def test_no_rows_make_no_groups() -> None:
    g = Groups(np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert len(g) == 0 and len(g.sum(np.zeros(0, np.int64))) == 0 and len(g.size()) == 0


def test_keys_densified_when_even_their_codes_overflow(monkeypatch: pytest.MonkeyPatch) -> None:
    """With little room (as with billions of rows) the key so far is densified too."""
    from analyze.tables import groups

    monkeypatch.setattr(groups, "_ROOM", 1 << 12)
    rng = np.random.default_rng(3)
    keys = [rng.integers(0, 200, 3000), rng.integers(0, 100, 3000), rng.integers(-5, 5, 3000)]
    g = Groups(*keys)
    want = pd.DataFrame({"a": keys[0], "b": keys[1], "c": keys[2]}).groupby(["a", "b", "c"]).size()
    assert [list(k[g.rows]) for k in keys] == [list(want.index.get_level_values(i)) for i in range(3)]
    assert list(g.size()) == list(want)
