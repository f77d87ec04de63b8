"""Step times and op groups, resolved once they can be read without waiting.

A step's clock (CUDA events, or host times) and a sampled step's op-group profile are queued at the step's
end and turned into numbers on a later step, when the device has caught up — never by synchronizing.
"""

from __future__ import annotations

from collections import deque

from anatomy.hook.guard import Feature, Guard
from anatomy.hook.lean import DeviceTimed
from anatomy.hook.opgroups import OpGroupProfiler
from anatomy.hook.record import StepRecord
from anatomy.hook.schedule import Schedule
from anatomy.hook.timing import StepClock, durations_from_marks
from anatomy.peaks import peak_flops
from anatomy.protocol import OpGroupStat, Timing
from anatomy.vocabulary import OpGroup, Precision


class Throughput:
    """The latest resolved step times, op groups and FLOP rate."""

    def __init__(self, guard: Guard, schedule: Schedule, samples: int | None, tokens: int | None) -> None:
        self._guard = guard
        self._schedule = schedule
        self.default_samples = samples
        self.default_tokens = tokens
        self._pending_clocks: deque[tuple[StepRecord | DeviceTimed, StepClock]] = deque()
        self._ready: tuple[StepRecord | DeviceTimed, StepClock] | None = None  # the newest resolved clock
        # Profiles (a whole step's, or a piece's) waiting to be read, in order, each with whether it
        # completes its round; a round's pieces add up to one step's op groups.
        self._pending_profiles: deque[tuple[int, OpGroupProfiler, bool]] = deque()
        self._round: dict[OpGroup, OpGroupStat] = {}
        self._round_flops = 0.0
        self.timing = Timing()
        self.timing_step: int | None = None
        self.op_groups: dict[OpGroup, OpGroupStat] | None = None
        self.op_groups_step: int | None = None
        self.step_flops: float | None = None
        # The steps are timed on the device (CUDA events): a step on the host clock alone (an ordinary step
        # the device did not time, promoted) leaves the device's times as they are.
        self.on_device = False

    @property
    def pending(self) -> int:
        return len(self._pending_clocks)

    @property
    def idle(self) -> bool:
        """Nothing waits to be resolved (no device clock, no op-group profile)."""
        return not self._pending_clocks and not self._pending_profiles

    def ready(self, rec: StepRecord) -> None:
        """``rec``'s host clock is the newest one (a step that ended without this class: its timing is
        taken from it at the next build)."""
        if not rec.clock.cuda and not self.on_device and Feature.TIMING not in self._guard.off:
            self._ready = (rec, rec.clock)

    @property
    def profiles_idle(self) -> bool:
        """No op-group profile waits to be read."""
        return not self._pending_profiles

    def device_step(self, timed: DeviceTimed, clock: StepClock) -> None:
        """A lean step's device clock (its events marked), read once the device has caught up, in order
        with every other step's."""
        self._pending_clocks.append((timed, clock))

    def step_finished(self, rec: StepRecord) -> None:
        if Feature.TIMING in self._guard.off:
            return
        clock = rec.clock
        if not clock.cuda and self.on_device:
            return
        if clock.cuda or self._pending_clocks:  # device times: read once the device has caught up
            self._pending_clocks.append((rec, clock))
            return
        marks = clock.marks  # host times: readable now, no queue
        if not marks:
            return
        self._ready = (rec, clock)
        step_s = marks[-1][1] - marks[0][1]
        if not rec.profiled and rec.index > 0 and step_s > 0:
            self._schedule.note_step_s(step_s)

    def profile_finished(self, index: int, profiler: OpGroupProfiler, complete: bool = True) -> None:
        """Step ``index``'s profile (the whole step's, or a piece's: ``complete`` when it is the last of
        its round), read once it can be."""
        self._pending_profiles.append((index, profiler, complete))

    def resolve(self) -> None:
        """Turn every clock and profile that completed into numbers (never waits)."""
        clocks = self._pending_clocks
        if clocks:
            try:
                self._resolve_clocks()
            except Exception as exc:
                self._guard.fail(Feature.TIMING, exc)
            if Feature.TIMING in self._guard.off:
                clocks.clear()  # a device error: no clock of this run is to be trusted
        profiles = self._pending_profiles
        while profiles:
            index, prof, complete = profiles[0]
            result = None
            with self._guard(Feature.OP_GROUPS):
                result = prof.result()
            if not self._guard.ok(Feature.OP_GROUPS):
                profiles.clear()
                return
            if result is None:
                return  # (device times not readable yet)
            profiles.popleft()
            total = self._round
            for group, stat in result.items():
                was = total.get(group)
                if was is not None:
                    flops = (was.flops or 0.0) + (stat.flops or 0.0)
                    stat = OpGroupStat(flops=flops, time_s=(was.time_s or 0.0) + (stat.time_s or 0.0))
                total[group] = stat
            self._round_flops += float(prof.total_flops or 0.0)
            if complete:
                self.op_groups, self._round = total, {}
                self.op_groups_step = index
                self.step_flops = self._round_flops or None
                self._round_flops = 0.0

    def _resolve_clocks(self) -> None:
        clocks = self._pending_clocks
        while clocks:
            rec, clock = clocks[0]
            step_s = clock.span_if_ready()
            if step_s is None:
                if len(clocks) > 64:  # a stream that never completes: drop the oldest
                    clocks.popleft()
                    continue
                break
            clocks.popleft()
            self._ready = (rec, clock)
            if not rec.profiled and rec.index > 0 and step_s > 0:
                self._schedule.note_step_s(step_s)

    def update_timing(self) -> None:
        """The newest resolved step's durations into ``timing`` (when a snapshot is built)."""
        ready, self._ready = self._ready, None
        if ready is None:
            return
        rec, clock = ready
        d = clock.durations() if clock.cuda else durations_from_marks(clock.marks)
        if d is None:
            return
        samples = rec.samples if rec.samples is not None else self.default_samples
        if samples is None and rec.samples_seen:
            samples = rec.samples_seen
        tokens = rec.tokens if rec.tokens is not None else self.default_tokens
        if tokens is None and rec.tokens_seen:
            tokens = rec.tokens_seen
        step_s = d.step_s
        # built every step: filled through its __dict__ (a frozen dataclass's __init__ costs a call a field)
        timing = object.__new__(Timing)
        timing.__dict__.update(
            step_s=step_s,
            forward_s=d.forward_s,
            backward_s=d.backward_s,
            optimizer_s=d.optimizer_s,
            samples_per_s=samples / step_s if samples and step_s > 0 else None,
            tokens_per_s=tokens / step_s if tokens and step_s > 0 else None,
        )
        self.timing = timing
        self.timing_step = rec.index

    def rates(
        self, device_name: str | None, precision: Precision, tf32: bool
    ) -> tuple[float | None, float | None]:
        """Achieved TFLOP/s (the sampled step's FLOPs over the median step time) and MFU, where the
        device's peak is known (``device_name``: a GPU's NVML name; None on CPU)."""
        step_s = self._schedule.median_step_s
        if not self.step_flops or step_s <= 0:
            return None, None
        achieved = self.step_flops / step_s
        mfu = None
        if device_name is not None and self._guard.ok(Feature.MFU):
            peak = peak_flops(device_name, precision, tf32=tf32)
            mfu = achieved / peak if peak else None
        return achieved / 1e12, mfu
