"""Pipeline schedules without ranks: each stage runs every forward and backward of its chunks exactly once, in an
order the timetable can run without deadlock; the timetable's idle ticks equal the textbook bubble; 1F1B keeps at
most P - stage micro-batches alive where GPipe keeps M; and impossible sizes are refused naming the numbers. The
zero-bubble schedules (zb1p, zbv, dualpipev) split backwards into I and a later W, place their chunks as they say,
run deadlock-free from their fewest micro-batches up, and their simulated bubbles and peak activations are the ones
their docstring states."""
import pytest

from infini_train.nn.parallel.pipeline_schedules import (SCHEDULES, SPLIT_SCHEDULES, V_SCHEDULES, Action,
                                                         ScheduleError, check_schedule, chunk_stage, forward_only_order,
                                                         ideal_bubble, min_micro_batches, simulate, stage_chunks,
                                                         stage_order, timetable)

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
    (("pipedream", 2, 1, 4), "parallel.pipeline_schedule: expected one of ('gpipe', '1f1b', 'interleaved', 'zb1p', "
                             "'zbv', 'dualpipev')"),
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


def _virtual(schedule):
    return 2 if schedule in V_SCHEDULES else 1


def _orders(schedule, P, M, V=None):
    V = _virtual(schedule) if V is None else V
    return [stage_order(schedule, P, V, M, s) for s in range(P)]


def _peak(order):
    """The most (chunk, micro-batch) activations held at once: an F adds one, a B or a W frees it."""
    live = top = 0
    for a in order:
        live += {"F": 1, "B": -1, "W": -1}.get(a.kind, 0)
        top = max(top, live)
    return top


@pytest.mark.parametrize("schedule", SPLIT_SCHEDULES)
@pytest.mark.parametrize("P", [2, 3, 4, 8])
def test_split_schedules_run_every_backward_once_in_micro_batch_order(schedule, P):
    V = _virtual(schedule)
    for M in range(min_micro_batches(schedule, P), 3 * P + 1):
        orders = _orders(schedule, P, M)
        for s, order in enumerate(orders):
            assert len(set(order)) == len(order)
            position = {(a.kind, a.chunk, a.mb): i for i, a in enumerate(order)}
            for chunk in stage_chunks(schedule, P, V, s):
                for m in range(M):
                    kinds = sorted(k for k, c, mb in position if (c, mb) == (chunk, m))
                    assert kinds in (["B", "F"], ["F", "I", "W"]), (schedule, P, M, s, chunk, m, kinds)
                    at = {k: position[(k, chunk, m)] for k in kinds}
                    assert at["F"] < at.get("B", at.get("I")) < at.get("W", len(order))
                for kind in ("F", "W", "BI"):
                    mbs = [a.mb for a in order if a.chunk == chunk and a.kind in kind]
                    assert mbs == sorted(mbs)
            assert {a.chunk for a in order} == set(stage_chunks(schedule, P, V, s))
        table = timetable(orders, P, V, schedule)
        for s in range(P):
            assert [row[s] for row in table if row[s] is not None] == orders[s]


@pytest.mark.parametrize("schedule,P,V", [("1f1b", 4, 1), ("interleaved", 3, 3), ("zb1p", 2, 1), ("zbv", 4, 2),
                                          ("dualpipev", 3, 2), ("gpipe", 1, 1)])
def test_placement_is_one_to_one(schedule, P, V):
    held = [stage_chunks(schedule, P, V, s) for s in range(P)]
    assert sorted(c for chunks in held for c in chunks) == list(range(P * V))
    for s, chunks in enumerate(held):
        assert len(chunks) == V and all(chunk_stage(schedule, P, V, c) == s for c in chunks)


def test_the_v_schedules_fold_the_chunks_at_the_last_stage():
    assert [stage_chunks("zbv", 4, 2, s) for s in range(4)] == [[0, 7], [1, 6], [2, 5], [3, 4]]
    assert [chunk_stage("dualpipev", 4, 2, c) for c in range(8)] == [0, 1, 2, 3, 3, 2, 1, 0]
    assert stage_chunks("interleaved", 4, 2, 1) == [1, 5] and chunk_stage("interleaved", 4, 2, 5) == 1


@pytest.mark.parametrize("schedule,P,M", [("zb1p", 4, 8), ("zbv", 4, 8), ("dualpipev", 3, 6), ("zbv", 2, 1)])
def test_every_dependency_finishes_before_its_tick(schedule, P, M):
    V = _virtual(schedule)
    table = timetable(_orders(schedule, P, M), P, V, schedule)
    tick_of = {(a.kind, a.chunk, a.mb): t for t, row in enumerate(table) for a in row if a is not None}
    last = P * V - 1
    for (kind, chunk, mb), t in tick_of.items():
        if kind == "F" and chunk > 0:
            assert tick_of[("F", chunk - 1, mb)] < t
        if kind in "BI":
            gradient = [tick_of.get((k, chunk + 1, mb)) for k in "BI"]
            assert (tick_of[("F", chunk, mb)] if chunk == last else min(g for g in gradient if g is not None)) < t
        if kind == "W":
            assert tick_of[("I", chunk, mb)] < t


def test_action_kinds_print_and_hash():
    assert repr(Action("I", 3, 1)) == "I3.1" and repr(Action("W", 0, 12)) == "W0.12"
    assert len({Action("I", 3, 1), Action("I", 3, 1), Action("W", 3, 1)}) == 2


def test_forward_only_runs_the_v_chunk_by_chunk():
    P, M = 2, 3
    orders = [forward_only_order(P, 2, M, s, "zbv") for s in range(P)]
    assert [(a.chunk, a.mb) for a in orders[0]] == [(0, 0), (0, 1), (0, 2), (3, 0), (3, 1), (3, 2)]
    assert [a.chunk for a in orders[1]] == [1, 1, 1, 2, 2, 2]
    assert sum(a is not None for row in timetable(orders, P, 2, "zbv") for a in row) == 2 * P * M


def test_an_action_on_a_stage_without_its_chunk_is_reported():
    with pytest.raises(ScheduleError, match=r"stage 1 runs \[F3.0\] of chunks it does not hold \(\[1, 2\]\)"):
        timetable([[Action("F", 0, 0)], [Action("F", 3, 0)]], 2, 2, "zbv")


@pytest.mark.parametrize("schedule,P,V,M", CASES)
def test_the_simulated_bubble_of_the_old_schedules_is_their_formula(schedule, P, V, M):
    bubbles = simulate(_orders(schedule, P, M, V), P, V, schedule)
    assert bubbles == pytest.approx([ideal_bubble(schedule, P, V, M)] * P)
    assert simulate(_orders(schedule, P, M, V), P, V, schedule, {"B": 1}) == pytest.approx(bubbles)


@pytest.mark.parametrize("P", [2, 3, 4, 8])
def test_zb1p_cuts_the_1f1b_bubble_to_about_a_third(P):
    for M in range(P, 3 * P + 1):
        zb1p, one_f_one_b = ideal_bubble("zb1p", P, 1, M), ideal_bubble("1f1b", P, 1, M)
        assert simulate(_orders("zb1p", P, M), P, 1, "zb1p") == pytest.approx([zb1p] * P)
        assert zb1p == pytest.approx((P - 1) / (3 * M + P - 1))
        assert one_f_one_b / 3 < zb1p < one_f_one_b / 2
    assert ideal_bubble("zb1p", P, 1, 1) < ideal_bubble("1f1b", P, 1, 1)


@pytest.mark.parametrize("schedule", V_SCHEDULES)
@pytest.mark.parametrize("P", [2, 3, 4, 8])
def test_the_v_schedules_leave_only_the_fill(schedule, P):
    for M in range(2 * P - 1, 3 * P + 1):
        bubble = ideal_bubble(schedule, P, 2, M)
        assert bubble == pytest.approx((P - 1) / (6 * M + P - 1))
        assert bubble < 0.55 * ideal_bubble("zb1p", P, 1, M)
        if M >= 2 * P:
            assert bubble < 1 / 13


@pytest.mark.parametrize("P", [2, 3, 4, 8])
def test_peak_activations_held_per_stage(P):
    for M in (1, P - 1, P, 2 * P - 1, 2 * P, 3 * P):
        if M < 1:
            continue
        one_f_one_b = [_peak(order) for order in _orders("1f1b", P, M)]
        assert one_f_one_b == [min(P - s, M) for s in range(P)]
        assert [_peak(order) for order in _orders("zb1p", P, M)] == [max(one_f_one_b)] * P
        if M >= 2 * P - 1:
            assert [_peak(order) for order in _orders("zbv", P, M)] == [2 * P] * P
            assert [_peak(order) for order in _orders("dualpipev", P, M)] == [2 * P + (M >= 2 * P - r)
                                                                               for r in range(P)]


@pytest.mark.parametrize("args,message", [
    (("zb1p", 4, 2, 8), "parallel.virtual_pipeline: expected 1 with parallel.pipeline_schedule='zb1p', got 2"),
    (("zbv", 4, 1, 8), "parallel.virtual_pipeline: zbv needs 2 model chunks per stage (laid out in a V), got 1\n"
                       "HINT: set parallel.virtual_pipeline=2"),
    (("dualpipev", 2, 3, 8), "dualpipev needs 2 model chunks per stage (laid out in a V), got 3"),
    (("dualpipev", 4, 2, 6), "dualpipev needs at least 2 x parallel.pipeline (4) - 1 = 7 micro-batches per step "
                             "(gradient-accumulation steps), got 6\nHINT: set train.total_batch_size so that total / "
                             "(batch_size x sequence_length x data-parallel size) is at least 7, or use zbv"),
])
def test_the_split_schedules_refuse_naming_the_numbers(args, message):
    with pytest.raises(ScheduleError) as info:
        check_schedule(*args)
    assert message in str(info.value)
    with pytest.raises(ScheduleError):
        stage_order(*args, 0)


def test_the_split_schedules_accept_their_fewest_micro_batches():
    for schedule in SCHEDULES:
        V = {"interleaved": 2}.get(schedule, _virtual(schedule))
        check_schedule(schedule, 4, V, min_micro_batches(schedule, 4))
    assert [min_micro_batches(s, 4) for s in SPLIT_SCHEDULES] == [1, 1, 7]
