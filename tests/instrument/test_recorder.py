"""Region stacks and step detection, independent of any backend."""

from __future__ import annotations

import threading

from instrument.tracer import recorder
from instrument.tracer.markers import region
from instrument.tracer.recorder import Recorder
from traceio import records
from traceio.records import Role


class FakeClock:
    def __init__(self) -> None:
        self.t = 0

    def now(self) -> int:
        self.t += 10
        return self.t


class Log(Recorder):
    """Records what a backend would be asked to emit."""

    def __init__(self) -> None:
        super().__init__(FakeClock())
        self.log: list[tuple] = []
        self.times: list[int] = []  # of each enter and leave, in order

    def name(self, rid: int) -> str:
        return self.region_defs[rid]["name"]

    def _emit_enter(self, loc: int, rid: int, t: int) -> None:
        self.log.append(("enter", loc, self.name(rid)))
        self.times.append(t)

    def _emit_leave(self, loc: int, rid: int, t: int) -> None:
        self.log.append(("leave", loc, self.name(rid)))
        self.times.append(t)

    def _emit_coll_end(self, loc, t, comm, op, root, sent, recv) -> None:  # type: ignore[no-untyped-def]
        self.log.append(("coll", loc, op, sent))

    def _emit_async(self, rid, begin, end, comm, op, root, sent, recv) -> None:  # type: ignore[no-untyped-def]
        self.log.append(("async", self.name(rid), begin, end))

    def _emit_step_discard(self, step_index: int, t: int) -> None:
        self.log.append(("discard", step_index))


def names(log: list[tuple]) -> list[str]:
    return [f"{e[0]}:{e[2]}" for e in log if e[0] in ("enter", "leave")]


def test_step_opens_at_first_activity_and_ends_with_the_optimizer() -> None:
    rec = Log()
    fwd, opt = rec.region_id(records.FORWARD), rec.region_id(records.OPTIMIZER)
    for _ in range(2):
        rec.enter(fwd)
        rec.leave(fwd)
        rec.enter(opt)
        rec.leave(opt)
        rec.optimizer_done()
    assert names(rec.log) == [
        "enter:dltrace.step", "enter:dltrace.forward", "leave:dltrace.forward",
        "enter:dltrace.optimizer", "leave:dltrace.optimizer", "leave:dltrace.step",
    ] * 2
    assert rec.steps_opened == 2


def test_step_waits_for_an_inner_region_to_close() -> None:
    rec = Log()
    user, opt = rec.region_id("loop_body"), rec.region_id(records.OPTIMIZER)
    rec.enter(user)
    rec.enter(opt)
    rec.leave(opt)
    rec.optimizer_done()
    assert names(rec.log)[-1] == "leave:dltrace.optimizer"
    rec.leave(user)
    assert names(rec.log)[-2:] == ["leave:loop_body", "leave:dltrace.step"]


def test_trailing_activity_without_optimizer_is_discarded() -> None:
    rec = Log()
    fwd = rec.region_id(records.FORWARD)
    rec.enter(fwd)
    rec.leave(fwd)
    rec.end_steps()
    assert ("discard", 0) in rec.log


def hand_updated_loop(rec: Log, steps: int, evaluate: int = 0) -> None:
    """A loop that updates the weights itself (pytorch/examples' regression): forward,
    backward, an untraced update; then ``evaluate`` forward passes without a backward."""
    fwd, bwd = rec.region_id(records.FORWARD), rec.region_id(records.BACKWARD)
    for _ in range(steps):
        rec.enter(fwd)
        rec.leave(fwd)
        rec.enter(bwd)
        rec.leave(bwd)
        rec.now()  # the update by hand takes time
    for _ in range(evaluate):
        rec.enter(fwd)
        rec.leave(fwd)


def test_without_an_optimizer_a_step_ends_where_the_next_forward_begins() -> None:
    rec = Log()
    hand_updated_loop(rec, 3)
    rec.end_steps()
    step = ["enter:dltrace.step", "enter:dltrace.forward", "leave:dltrace.forward",
            "enter:dltrace.backward", "leave:dltrace.backward", "leave:dltrace.step"]
    assert names(rec.log) == step * 3
    assert rec.steps_opened == 3 and rec.steps_discarded == 0
    t = {(e[0], e[2], i // 6): t for i, (e, t) in enumerate(zip(rec.log, rec.times, strict=True))}
    # a step ends when the next forward begins (the update stays in the step) ...
    assert t[("leave", "dltrace.step", 0)] == t[("enter", "dltrace.forward", 1)]
    assert t[("leave", "dltrace.step", 0)] > t[("leave", "dltrace.backward", 0)]
    # ... and the last one with its backward, not at shutdown
    assert t[("leave", "dltrace.step", 2)] == t[("leave", "dltrace.backward", 2)]


def test_without_an_optimizer_evaluation_after_the_last_backward_is_the_tail() -> None:
    rec = Log()
    hand_updated_loop(rec, 2, evaluate=3)
    rec.end_steps()
    assert rec.steps_opened == 3 and ("discard", 2) in rec.log


def test_a_script_with_an_optimizer_keeps_micro_batches_in_one_step() -> None:
    rec = Log()
    rec.optimizer_expected = True  # the torch hooks saw an optimizer being made
    hand_updated_loop(rec, 4)  # gradient accumulation over 4 micro-batches
    opt = rec.region_id(records.OPTIMIZER)
    rec.enter(opt)
    rec.leave(opt)
    rec.optimizer_done()
    assert rec.steps_opened == 1
    assert names(rec.log).count("enter:dltrace.forward") == 4


def test_an_end_step_marker_turns_the_fallback_off() -> None:
    rec = Log()
    hand_updated_loop(rec, 1)
    rec.optimizer_done()  # what instrument.tracer.markers.end_step calls
    hand_updated_loop(rec, 3)
    rec.optimizer_done()
    assert rec.steps_opened == 2


def test_leave_unwinds_regions_left_open_by_an_exception() -> None:
    rec = Log()
    a, b, c = rec.region_id("a"), rec.region_id("b"), rec.region_id("c")
    rec.enter(a)
    rec.enter(b)
    rec.enter(c)
    rec.leave(a)
    assert names(rec.log)[-3:] == ["leave:c", "leave:b", "leave:a"]
    rec.leave(b)  # no longer open: ignored
    assert names(rec.log)[-1] == "leave:a"


def test_artificial_regions_do_not_open_steps() -> None:
    rec = Log()
    flush = rec.region_id(records.TRACER_FLUSH, Role.ARTIFICIAL)
    rec.enter(flush)
    rec.leave(flush)
    assert names(rec.log) == ["enter:dltrace.flush", "leave:dltrace.flush"]


def test_threads_get_their_own_locations_and_no_steps() -> None:
    rec = Log()
    r = rec.region_id("work")

    def worker() -> None:
        rec.enter(r)
        rec.leave(r)

    t = threading.Thread(target=worker, name="w")
    t.start()
    t.join()
    assert rec.log == [("enter", 1, "work"), ("leave", 1, "work")]
    assert rec.thread_names == ["main thread", "thread w"]


def test_user_region_marker_with_and_without_a_recorder() -> None:
    with region("untraced"):  # no recorder installed: nothing happens
        pass
    rec = Log()
    recorder.install(rec)
    try:
        with region("data_aug"):
            pass

        @region("decorated")
        def f() -> int:
            return 1

        assert f() == 1
    finally:
        recorder.install(None)
    assert names(rec.log) == ["enter:dltrace.step", "enter:data_aug", "leave:data_aug",
                              "enter:decorated", "leave:decorated"]


def test_named_locations_take_complete_intervals() -> None:
    rec = Log()
    loc = rec.named_loc("horovod: grad.0", kind="timeline")
    rid = rec.region_id("horovod.NEGOTIATE_ALLREDUCE")
    rec.interval(loc, rid, 5, 9)
    assert rec.log == [("enter", loc, "horovod.NEGOTIATE_ALLREDUCE"), ("leave", loc, "horovod.NEGOTIATE_ALLREDUCE")]
    assert rec.loc_kinds[loc] == "timeline" and rec.steps_opened == 0
