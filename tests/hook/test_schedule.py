"""What runs on which step: warm-up steps do everything, steady state only what is due."""

from __future__ import annotations

from anatomy.hook.schedule import REFRESH, TRACE_EVERY, WARMUP_REFRESH_STEPS, Budget, Schedule


def test_refresh_and_sampling_steps() -> None:
    s = Schedule(sample_every=10, interval_s=1.0)
    assert [i for i in range(35) if s.refresh_due(i)] == [*range(WARMUP_REFRESH_STEPS), 10, 20, 30]
    assert [i for i in range(35) if s.sample_due(i)] == [1, 10, 20, 30]  # never the warm-up step 0
    assert not any(Schedule(0, 1.0).sample_due(i) for i in range(5))


def test_trace_on_first_sample_after_shape_change_and_every_nth() -> None:
    s = Schedule(sample_every=10, interval_s=1.0)
    assert s.trace_due(1, have_trace=False)
    assert not s.trace_due(20, have_trace=True)
    assert s.trace_due(10 * TRACE_EVERY, have_trace=True)
    s.retrace = True
    assert s.trace_due(20, have_trace=True)


def test_counting_follows_shapes_and_the_publish_interval() -> None:
    s = Schedule(sample_every=100, interval_s=1.0)
    for _ in range(5):
        s.note_step_s(0.25)  # 4 steps per interval
    assert s.steps_per_interval() == 4
    assert s.count_due(0, (4, 8), already=False)  # warm-up
    s.counted_step = 2
    assert not s.count_due(3, (4, 8), already=False)
    assert s.count_due(6, (4, 8), already=False)  # an interval later
    s.counted_step = 6
    assert s.count_due(7, (8, 8), already=False) and s.retrace  # a new shape: counted, and traced again


def test_heap_read_on_warmup_sampled_steps_and_once_per_interval() -> None:
    s = Schedule(sample_every=100, interval_s=1.0)
    for _ in range(5):
        s.note_step_s(0.5)  # 2 steps per interval
    assert s.heap_due(5)  # nothing read yet
    s.heap_step = 5
    assert not s.heap_due(6) and s.heap_due(7) and s.heap_due(100)


def test_quiet_until_is_the_first_step_anything_can_be_due() -> None:
    """Every step before ``quiet_until`` answers no to every periodic check, so the tracker may skip them;
    work the budget holds back moves it to when the budget will have room, at the current pace."""
    from anatomy.hook.schedule import Budget

    now = [0.0]
    s = Schedule(sample_every=100, interval_s=1.0, budget=Budget(0.01, clock=lambda: now[0]))
    for _ in range(5):
        s.note_step_s(0.1)  # 10 steps per interval
    assert s.quiet_until(1, looked_at=0) == 1  # warm-up: never quiet
    now[0] = 1000.0  # plenty of budget
    s.heap_step, s.counted_step = 40, 42
    until = s.quiet_until(45, looked_at=44)
    assert until == 50  # the heap read, an interval after step 40
    quiet = range(45, until)
    assert not any(s.heap_due(i) or s.count_due(i, None, False) or s.look_due(i, 44) for i in quiet)
    assert s.heap_due(until)
    s.heap_step = s.counted_step = 95
    assert s.quiet_until(96, looked_at=96) == 100  # the re-sum and sampled step
    s.budget.spent_s = 10.5  # over budget: 10 s spent of 1000 s × 1%
    s.budget.cost["heap"] = 0.5  # a heap read costs 0.5 s: room for it after 1100 s, 100 s (1,000 steps) on
    s.heap_step, s.counted_step = 200, 205
    assert s.quiet_until(210, looked_at=209) == 215  # the count, which has no cost on record
    s.budget.cost["count"] = 0.5
    s.budget.cost["look"] = 0.5
    # everything past due waits for the budget (1,000 steps), but not past the next re-sum
    assert s.quiet_until(230, looked_at=200) == 300
    s.sample_every = 0
    assert s.quiet_until(230, looked_at=200) == 230 + 1000


def test_a_periodic_re_sum_waits_for_the_budget() -> None:
    """The first steps re-sum whatever they cost; a periodic re-sum that does not fit the budget waits for
    the first later step that does (the sums stand meanwhile), then one in ``sample_every`` again."""
    now = [0.0]
    budget = Budget(0.01, clock=lambda: now[0])
    s = Schedule(sample_every=10, interval_s=1.0, budget=budget)
    budget.charge(REFRESH, 1.0)  # the warm-up's re-sums cost a second
    assert all(s.refresh_due(i) for i in range(WARMUP_REFRESH_STEPS))
    now[0] = 50.0  # 0.5 s of budget so far: no room for another second
    assert not s.refresh_due(10) and not s.refresh_due(10)  # (the same answer within the step)
    assert not s.refresh_due(11)
    now[0] = 200.0  # 2 s of budget: room
    assert s.refresh_due(12) and not s.refresh_due(13)  # the owed one, then back to one in ten
    assert s.refresh_due(20)
    for _ in range(3):
        s.note_step_s(0.25)
    s.heap_step = s.counted_step = 20
    budget.charge(REFRESH, 10.0)
    assert not s.refresh_due(30)
    assert s.quiet_until(31, looked_at=30) > 31  # an owed re-sum waits for the budget, not every step


def test_a_costly_sampled_step_does_not_hold_the_re_sums_back() -> None:
    """A profiling episode far over the budget holds the next sampled step back, not the cheap kinds:
    they keep a share of the allowance (``RESERVED_SHARE``), which sampled steps never spend."""
    from anatomy.hook.schedule import COUNT, HEAP, RESERVED_SHARE, SAMPLED, Budget

    now = [0.0]
    budget = Budget(0.01, clock=lambda: now[0])
    budget.charge(SAMPLED, 0.081)  # an 81 ms episode
    budget.charge(REFRESH, 0.00045)  # re-sums of 0.45 ms
    now[0] = 1.0  # 10 ms of allowance: the episode alone is 8 times that
    assert not budget.allows(SAMPLED)
    assert budget.allows(REFRESH) and budget.allows(COUNT) and budget.allows(HEAP)  # (no cost known: 0)
    s = Schedule(sample_every=10, interval_s=1.0, budget=budget)
    assert s.refresh_due(10) and not s.sample_due(10)
    # sampled steps never spend the cheap kinds' unspent reserve, even where the total has room
    now[0] = 0.0
    budget = Budget(0.01, clock=lambda: now[0])
    budget.charge(SAMPLED, 0.05)
    now[0] = 10.0  # 100 ms of allowance, 50 ms spent: a second 50 ms episode would leave no reserve
    assert budget.allowance_s() >= budget.spent_s + budget.cost[SAMPLED]
    assert not budget.allows(SAMPLED)
    room = 0.1 / (1 - RESERVED_SHARE) / 0.01  # the training time whose allowance holds both and the reserve
    now[0] = room * 0.99
    assert not budget.allows(SAMPLED)
    now[0] = room * 1.001
    assert budget.allows(SAMPLED)


def test_the_two_accounts_never_spend_more_than_the_allowance_and_say_when_they_can() -> None:
    """Random work of every kind, each run only where ``allows`` says so (at the cost it last measured):
    the total never passes the allowance, and ``wait_s`` is the training time after which it is allowed."""
    import random

    from anatomy.hook.schedule import COUNT, HEAP, LOOK, SAMPLED, Budget

    rng = random.Random(0)
    now = [0.0]
    budget = Budget(0.01, clock=lambda: now[0])
    kinds = [SAMPLED, REFRESH, HEAP, COUNT, LOOK]
    costs = {SAMPLED: 0.08, REFRESH: 0.0005, HEAP: 0.002, COUNT: 0.004, LOOK: 0.003}
    for kind, cost in costs.items():
        budget.note(kind, cost)
    ran = dict.fromkeys(kinds, 0)
    for _ in range(20000):
        now[0] += rng.uniform(0.0, 0.02)
        kind = rng.choice(kinds)
        wait = budget.wait_s(kind)
        if budget.allows(kind):
            assert wait == 0.0
            budget.charge(kind, costs[kind])
            ran[kind] += 1
            assert budget.spent_s <= budget.allowance_s() + 1e-12
        else:
            assert wait > 0.0
            now[0] += wait  # (then it fits, to the float's rounding)
            assert budget.wait_s(kind) < 1e-6
            now[0] -= wait
    assert ran[REFRESH] and ran[HEAP]  # (the cheapest take what room there is: the kinds' rates are the
    # schedule's, per interval; here every kind asks all the time)
    assert budget.sampled_s <= (1 - budget.reserved) * budget.allowance_s() + 1e-12
