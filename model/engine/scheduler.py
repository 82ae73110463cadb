"""Which sequences run: a FIFO of waiting requests and a fixed set of cache slots.

Continuous batching: a finished sequence gives its slot back at once and the next
waiting request is admitted before the next round, so short lines never wait for a long
table in the same batch to end.

Running sequences always fill slots 0..n-1 (`running[i].slot == i`): when one finishes,
the sequence in the last slot moves into its place (the engine copies that one KV), so
every pass reads the cache as a view of its first n slots instead of gathering rows.
"""

from __future__ import annotations

from collections import deque

from .sequence import Sequence


class Scheduler:
    def __init__(self, max_slots: int):
        self.max_slots = max_slots
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # running[i] occupies slot i

    def add(self, sequence: Sequence) -> None:
        self.waiting.append(sequence)

    def admit(self) -> list[Sequence]:
        """Move waiting sequences into the free slots, oldest first."""
        admitted = []
        while self.waiting and len(self.running) < self.max_slots:
            sequence = self.waiting.popleft()
            sequence.slot = len(self.running)
            self.running.append(sequence)
            admitted.append(sequence)
        return admitted

    def withdraw(self, sequence: Sequence) -> None:
        """Take a sequence that was never admitted out of the queue."""
        self.waiting = deque(s for s in self.waiting if s is not sequence)

    def release(self, sequence: Sequence) -> tuple[Sequence, int] | None:
        """Free `sequence`'s slot; if another sequence moved into it, return that one and
        the slot it left (its KV must follow)."""
        freed, last = sequence.slot, self.running.pop()
        if last is sequence:
            return None
        moved_from, last.slot = last.slot, freed
        self.running[freed] = last
        return last, moved_from

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)
