"""Pipeline schedules without ranks: each stage runs every forward and backward of its chunks exactly once, in an
order the timetable can run without deadlock; the timetable's idle ticks equal the textbook bubble; 1F1B keeps at
most P - stage micro-batches alive where GPipe keeps M; and impossible sizes are refused naming the numbers."""
import pytest

from infini_train.nn.parallel.pipeline_schedules import (Action, ScheduleError, check_schedule, forward_only_order,
                                                         ideal_bubble, stage_order, timetable)

CASES = [("gpipe", 2, 1, 8), ("gpipe", 4, 1, 8), ("1f1b", 2, 1, 8), ("1f1b", 4, 1, 8), ("1f1b", 4, 1, 2),
         ("1f1b", 3, 1, 5), ("interleaved", 2, 2, 8), ("interleaved", 4, 2, 8), ("interleaved", 2, 2, 2),
         ("interleaved", 4, 3, 12)]


@pytest.mark.parametrize("schedule,P,V,M", CASES)
def test_every_action_once_and_the_timetable_matches_the_ideal_bubble(schedule, P, V, M):
    orders = [stage_order(schedule, P, V, M, s) for s in range(P)]
    for s, order in enumerate(orders):
        expected = {Action(k, local * P + s, m) for k in "FB" for local in range(V) for m in range(M)}
        assert len(order) == len(expected) and set(order) == expected
        for a in order:  # a chunk's backward comes after its forward on the same stage
            if a.kind == "B":
                assert order.index(Action("F", a.chunk, a.mb)) < order.index(a)
    table = timetable(orders, P, V)
    for s in range(P):
        assert [row[s] for row in table if row[s] is not None] == orders[s]
    busy = 2 * M * V
    assert 1 - busy / len(table) == pytest.approx(ideal_bubble(schedule, P, V, M))


@pytest.mark.parametrize("P,M", [(2, 8), (4, 8), (4, 3)])
def test_1f1b_holds_at_most_p_minus_stage_micro_batches_and_gpipe_all(P, M):
    def peak(order):
        live = top = 0
        for a in order:
            live += 1 if a.kind == "F" else -1
            top = max(top, live)
        return top

    for s in range(P):
        assert peak(stage_order("1f1b", P, 1, M, s)) == min(P - s, M)
        assert peak(stage_order("gpipe", P, 1, M, s)) == M


def test_a_message_is_produced_before_the_tick_that_consumes_it():
    P, V, M = 4, 2, 8
    table = timetable([stage_order("interleaved", P, V, M, s) for s in range(P)], P, V)
    tick_of = {(a.kind, a.chunk, a.mb): t for t, row in enumerate(table) for a in row if a is not None}
    for (kind, chunk, mb), t in tick_of.items():
        if kind == "F" and chunk > 0:
            assert tick_of[("F", chunk - 1, mb)] < t
        if kind == "B" and chunk < P * V - 1:
            assert tick_of[("B", chunk + 1, mb)] < t


def test_forward_only_order_and_its_timetable():
    P, V, M = 2, 2, 3
    orders = [forward_only_order(P, V, M, s) for s in range(P)]
    assert orders[1] == [Action("F", 1, 0), Action("F", 1, 1), Action("F", 1, 2), Action("F", 3, 0),
                         Action("F", 3, 1), Action("F", 3, 2)]
    assert sum(a is not None for row in timetable(orders, P, V) for a in row) == P * V * M


def test_a_deadlocking_order_is_reported():
    orders = [[Action("B", 0, 0), Action("F", 0, 0)], [Action("F", 1, 0), Action("B", 1, 0)]]
    with pytest.raises(ScheduleError, match="deadlocks at tick"):
        timetable(orders, 2, 1)


@pytest.mark.parametrize("args,message", [
    (("pipedream", 2, 1, 4), "parallel.pipeline_schedule: expected one of ('gpipe', '1f1b', 'interleaved')"),
    (("1f1b", 2, 2, 4), "parallel.virtual_pipeline: expected 1 with parallel.pipeline_schedule='1f1b', got 2"),
    (("interleaved", 2, 1, 4), "interleaved needs parallel.virtual_pipeline >= 2"),
    (("interleaved", 4, 2, 2), "micro-batches per step (gradient-accumulation steps, 2) to be a multiple of "
                               "parallel.pipeline (4)"),
    (("interleaved", 4, 2, 6), "to be a multiple of parallel.pipeline (4)\nHINT: set train.total_batch_size so that "
                               "total / (batch_size x sequence_length x data-parallel size) is 8"),
])
def test_impossible_combinations_name_the_numbers(args, message):
    with pytest.raises(ScheduleError) as info:
        check_schedule(*args)
    assert message in str(info.value)
