"""When a training run ends and how fast it learns on the way: the learning-rate schedule and
the time budget that re-plans the step count."""

from __future__ import annotations

import math
from dataclasses import dataclass

TIME_BUDGET_WINDOW = (5, 35)  # steps of an invocation timed to plan its budget (after start-up costs)
REPLAN_EVERY = 50  # steps between later re-plans of a budget


@dataclass
class LearningRateSchedule:
    """Linear warm-up to `peak`, then a cosine down to `floor` at `end_step`.

    When a time budget moves the end, the cosine goes on from the progress it had reached,
    over the steps left, so the rate never jumps. (A resumed run asked for another step count
    starts a schedule of that length: the Trainer decides.)"""

    peak: float
    floor: float
    warmup_steps: int
    end_step: int
    anchor_step: int = -1  # the cosine's progress is anchor_progress here; -1: the warm-up's end
    anchor_progress: float = 0.0

    def __post_init__(self) -> None:
        if self.anchor_step < 0:
            self.anchor_step = self.warmup_steps

    def progress(self, step: int) -> float:
        """How far along the cosine `step` is: 0 at its start, 1 at its end."""
        if step <= self.anchor_step:
            return self.anchor_progress
        left = (step - self.anchor_step) / max(1, self.end_step - self.anchor_step)
        return min(1.0, self.anchor_progress + (1 - self.anchor_progress) * left)

    def rate(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.peak * (step + 1) / self.warmup_steps
        cosine = 0.5 * (1 + math.cos(math.pi * self.progress(step)))
        return self.floor + (self.peak - self.floor) * cosine

    def retarget(self, step: int, end_step: int) -> None:
        """End at `end_step` instead, continuing from the rate at `step`."""
        anchor = max(step, self.warmup_steps)
        self.anchor_progress = self.progress(anchor)
        self.anchor_step = anchor
        self.end_step = end_step

    def plan(self) -> dict:
        """What a checkpoint keeps of the schedule: where it ends and where its cosine stands."""
        return {"end_step": self.end_step, "anchor_step": self.anchor_step, "anchor_progress": self.anchor_progress}


@dataclass
class TimeBudget:
    """One invocation's time budget (a leased GPU, a nightly slot): steps 5-35 of the
    invocation are timed, then the run is fitted to the time left, and again every
    REPLAN_EVERY steps from the speed since the timing began (a machine that slows down
    still anneals inside the budget); a run slower than planned still stops on time."""

    seconds: float
    first_step: int  # the step this invocation started from (a resumed run starts late)
    longest_end: int  # the step count asked for: a re-plan never goes past it
    window_started: float | None = None

    def planned_end(self, step: int, elapsed: float, end_step: int) -> int:
        """The step to end at, given `step` reached `elapsed` seconds into the invocation and
        the run now ends at `end_step`. A re-plan may also lengthen the run again (up to
        `longest_end`): a slow spell that has passed, such as an evaluation sharing the
        machine, no longer cuts the rest of the budget."""
        done = step - self.first_step
        if done == TIME_BUDGET_WINDOW[0]:
            self.window_started = elapsed
        elif (done >= TIME_BUDGET_WINDOW[1] and (done - TIME_BUDGET_WINDOW[1]) % REPLAN_EVERY == 0
              and self.window_started is not None):
            per_step = (elapsed - self.window_started) / (done - TIME_BUDGET_WINDOW[0])
            end_step = min(self.longest_end, step + int((self.seconds - elapsed) / per_step))
        if elapsed >= self.seconds:
            end_step = min(end_step, step)
        return max(step, end_step)
