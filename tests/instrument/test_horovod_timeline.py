"""Horovod's timeline: parsing (complete and cut files), clock conversion, layout, the
alignment check and the import into a recorder, on literal inputs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from instrument.hooks import horovod_timeline as ht
from instrument.tracer.recorder import Recorder

# A 2-tensor timeline as Horovod 0.28.1 writes it on CPU/Gloo (one fused allreduce of both
# tensors), with its line breaks: metadata records end a line, events follow each other.
TEXT = """[
{"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros":1700000000000000}},
{"name": "process_sort_index", "ph": "M", "pid": 0, "args": {"sort_index": 0}},
{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "allreduce.fc.weight"}},
{"name": "process_sort_index", "ph": "M", "pid": 1, "args": {"sort_index": 1}},
{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 100, "pid": 1},{"ph": "X", "name": "1", "ts": 100, "pid": 1, "dur": 0},{"name": "process_name", "ph": "M", "pid": 2, "args": {"name": "allreduce.fc.bias"}},
{"name": "process_sort_index", "ph": "M", "pid": 2, "args": {"sort_index": 2}},
{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 101, "pid": 2},{"ph": "X", "name": "1", "ts": 101, "pid": 2, "dur": 0},{"ph": "X", "name": "0", "ts": 150, "pid": 1, "dur": 0},{"ph": "E", "ts": 150, "pid": 1},{"ph": "X", "name": "0", "ts": 151, "pid": 2, "dur": 0},{"ph": "E", "ts": 151, "pid": 2},{"ph": "B", "name": "ALLREDUCE", "ts": 160, "pid": 1},{"ph": "B", "name": "ALLREDUCE", "ts": 161, "pid": 2},{"ph": "B", "name": "MEMCPY_IN_FUSION_BUFFER", "ts": 162, "pid": 1},{"ph": "B", "name": "MEMCPY_IN_FUSION_BUFFER", "ts": 163, "pid": 2},{"ph": "E", "ts": 170, "pid": 1},{"ph": "E", "ts": 171, "pid": 2},{"ph": "B", "name": "GLOO_ALLREDUCE", "ts": 172, "pid": 1},{"ph": "B", "name": "GLOO_ALLREDUCE", "ts": 172, "pid": 2},{"ph": "E", "ts": 300, "pid": 1},{"ph": "E", "ts": 301, "pid": 2},{"ph": "B", "name": "MEMCPY_OUT_FUSION_BUFFER", "ts": 302, "pid": 1},{"ph": "B", "name": "MEMCPY_OUT_FUSION_BUFFER", "ts": 302, "pid": 2},{"ph": "E", "ts": 310, "pid": 1},{"ph": "E", "ts": 311, "pid": 2},{"ph": "E", "ts": 312, "pid": 1, "args": {"dtype": "float32", "shape": "[10, 4]"}},{"ph": "E", "ts": 313, "pid": 2, "args": {"dtype": "float32", "shape": "[10]"}}]"""

# realtime - monotonic, chosen so that timeline microsecond 0 is our 5 s
OFFSET = 1_700_000_000_000_000_000 - 5_000_000_000
T0 = 5_000_000_000


def test_parse_a_complete_file() -> None:
    tl = ht.parse(TEXT)
    assert tl.start_epoch_us == 1_700_000_000_000_000 and not tl.truncated
    # 6 metadata records; per tensor 2 negotiation, 2 ready marks, 8 operation records
    assert tl.records == 6 + 2 * 12 and tl.unmatched_ends == 0 and tl.unclosed == 0
    weight = sorted((a.name, a.start_us, a.end_us, a.depth) for a in tl.activities
                    if a.tensor == "allreduce.fc.weight")
    assert weight == [("ALLREDUCE", 160, 312, 0), ("GLOO_ALLREDUCE", 172, 300, 1),
                      ("MEMCPY_IN_FUSION_BUFFER", 162, 170, 1), ("MEMCPY_OUT_FUSION_BUFFER", 302, 310, 1),
                      ("NEGOTIATE_ALLREDUCE", 100, 150, 0)]
    assert sorted(tl.ready) == [("allreduce.fc.bias", 0, 151), ("allreduce.fc.bias", 1, 101),
                                ("allreduce.fc.weight", 0, 150), ("allreduce.fc.weight", 1, 100)]


def test_parse_a_file_cut_mid_record_closes_open_activities_at_the_last_time() -> None:
    cut = TEXT[: TEXT.index('{"ph": "E", "ts": 300')] + '{"ph": "E", "t'  # a rank died here
    tl = ht.parse(cut)
    assert tl.truncated and tl.start_epoch_us == 1_700_000_000_000_000
    still_open = sorted((a.tensor, a.name, a.start_us, a.end_us, a.depth) for a in tl.activities if not a.closed)
    assert still_open == [
        ("allreduce.fc.bias", "ALLREDUCE", 161, 172, 0), ("allreduce.fc.bias", "GLOO_ALLREDUCE", 172, 172, 1),
        ("allreduce.fc.weight", "ALLREDUCE", 160, 172, 0), ("allreduce.fc.weight", "GLOO_ALLREDUCE", 172, 172, 1)]
    assert sum(a.closed for a in tl.activities) == 4  # two negotiations, two copies in


def test_parse_without_the_closing_bracket_and_with_a_stray_end() -> None:
    tl = ht.parse(TEXT[:-1] + ',{"ph": "E", "ts": 400, "pid": 1}')
    assert tl.truncated and tl.unmatched_ends == 1 and len(tl.activities) == 10
    assert ht.parse("").start_epoch_us is None and ht.parse("[").activities == []


def test_timeline_microseconds_to_our_nanoseconds() -> None:
    assert ht.to_local_ns(0, 1_700_000_000_000_000, OFFSET) == T0
    assert ht.to_local_ns(312, 1_700_000_000_000_000, OFFSET) == T0 + 312_000


def test_realtime_offset_keeps_the_tightest_reading() -> None:
    real = iter([1000, 1100, 2000, 2010, 3000, 3500])  # gaps 100, 10, 500 ns
    mono = iter([50, 1005, 3200])
    assert ht.realtime_offset(lambda: next(mono), lambda: next(real), tries=3) == (2005 - 1005, 10)


def test_fused_activities_merge_and_overlaps_get_lanes() -> None:
    assert ht.fused([("GLOO", 172, 300), ("COPY", 162, 170), ("GLOO", 172, 301), ("COPY", 163, 171)]) == [
        ("COPY", 162, 171), ("GLOO", 172, 301)]
    assert ht.first_fit([("A", 0, 10), ("B", 5, 8), ("C", 10, 12)]) == [
        [("A", 0, 10), ("C", 10, 12)], [("B", 5, 8)]]


def test_layout_puts_tensors_and_the_background_thread_on_locations() -> None:
    out = ht.layout(ht.parse(TEXT), OFFSET)
    us = 1000
    assert out["horovod allreduce.fc.weight"] == [[("NEGOTIATE_ALLREDUCE", T0 + 100 * us, T0 + 150 * us),
                                                   ("ALLREDUCE", T0 + 160 * us, T0 + 312 * us)]]
    assert out["horovod activities"] == [[("MEMCPY_IN_FUSION_BUFFER", T0 + 162 * us, T0 + 171 * us),
                                          ("GLOO_ALLREDUCE", T0 + 172 * us, T0 + 301 * us),
                                          ("MEMCPY_OUT_FUSION_BUFFER", T0 + 302 * us, T0 + 311 * us)]]
    with pytest.raises(ValueError, match="no start time"):
        ht.layout(ht.parse(TEXT.replace("start_time_since_epoch_in_micros", "x")), OFFSET)


class Capture(Recorder):
    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, int, str, int]] = []

    def _emit_enter(self, loc: int, rid: int, t: int) -> None:
        self.log.append(("enter", loc, self.region_defs[rid]["name"], t))

    def _emit_leave(self, loc: int, rid: int, t: int) -> None:
        self.log.append(("leave", loc, self.region_defs[rid]["name"], t))


def test_import_writes_time_ordered_intervals_on_timeline_locations() -> None:
    rec = Capture()
    counts = ht.import_timeline(rec, ht.parse(TEXT), OFFSET)
    assert counts == {"locations": 3, "intervals": 7}
    assert rec.thread_names[1:] == ["horovod allreduce.fc.weight", "horovod allreduce.fc.bias",
                                    "horovod activities"]
    assert rec.loc_kinds[1:] == ["timeline"] * 3
    for loc in (1, 2, 3):
        times = [t for _, lo, _, t in rec.log if lo == loc]
        assert times == sorted(times)
    assert [(k, n, t - T0) for k, lo, n, t in rec.log if lo == 1] == [
        ("enter", "horovod.NEGOTIATE_ALLREDUCE", 100_000), ("leave", "horovod.NEGOTIATE_ALLREDUCE", 150_000),
        ("enter", "horovod.ALLREDUCE", 160_000), ("leave", "horovod.ALLREDUCE", 312_000)]
    roles = {d["name"]: d["role"] for d in rec.region_defs}
    assert roles["horovod.NEGOTIATE_ALLREDUCE"] == "wait" and roles["horovod.GLOO_ALLREDUCE"] == "function"
    assert rec.steps_opened == 0  # imported activities never open a training step


def test_check_bounds_the_alignment_error_from_enqueue_and_completion_times() -> None:
    seen = ht.Observed()
    seen.enabled = True
    seen.add("allreduce.fc.weight", T0 + 90_000, T0 + 320_000)
    seen.add("allreduce.fc.bias", T0 + 95_000, T0 + 315_000)
    seen.add("allreduce.not.in.timeline", T0, T0 + 1)
    result = ht.check(ht.parse(TEXT), OFFSET, seen)
    # op starts 160/161 us, ends 312/313 us, rank 0 ready at 150/151 us
    assert result["pairs"] == 2
    assert result["min_start_margin_ns"] == 161_000 - 95_000
    assert result["min_end_margin_ns"] == 315_000 - 313_000
    assert result["ready_pairs"] == 2 and result["min_ready_margin_ns"] == 151_000 - 95_000
    # an alignment off by 10 us shows as a negative end margin
    assert ht.check(ht.parse(TEXT), OFFSET - 10_000, seen)["min_end_margin_ns"] == -8_000


def test_request_points_every_rank_at_the_run_directory_and_rank_0_imports(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ht, "_requested", {})
    monkeypatch.setattr(ht, "OBSERVED", ht.Observed())
    env = {ht.OPT_IN: "1"}
    assert ht.request(env, tmp_path, rank=1) is None
    assert env["HOROVOD_TIMELINE"] == str(tmp_path / ht.FILE_NAME) and not ht.OBSERVED.enabled
    assert ht.request({ht.OPT_IN: "1"}, tmp_path, rank=0) == tmp_path / ht.FILE_NAME
    assert ht.OBSERVED.enabled
    own = {"HOROVOD_TIMELINE": "DYNAMIC", ht.OPT_IN: "1"}
    monkeypatch.setattr(ht, "_requested", {})
    assert ht.request(own, tmp_path, rank=0) is None and own["HOROVOD_TIMELINE"] == "DYNAMIC"
    assert ht.request({}, tmp_path, rank=0) is None  # not asked for: nothing


def test_import_at_exit_reads_a_cut_file_and_reports_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / ht.FILE_NAME
    path.write_text(TEXT[: TEXT.index('{"ph": "E", "ts": 300')])
    monkeypatch.setattr(ht, "_requested", {})
    ht.request({"HOROVOD_TIMELINE": os.fspath(path)}, tmp_path, rank=0)

    class Meta(Capture):
        meta: dict[str, object] = {}

        def set_meta(self, key: str, value: object) -> None:
            self.meta[key] = value

    rec = Meta()
    ht.import_at_exit(rec)
    ht.import_at_exit(rec)  # once only
    summary = rec.meta["horovod_timeline"]
    assert isinstance(summary, dict)
    assert summary["truncated"] is True and summary["unclosed"] == 4 and summary["intervals"] == 6
    assert len([e for e in rec.log if e[0] == "enter"]) == 6
