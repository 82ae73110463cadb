"""Which sequences run, and what a round does to them.

Continuous batching: a FIFO of waiting requests and a fixed set of cache slots; a
finished sequence gives its slot back at once and the next waiting request is admitted
before the next round, so short lines never wait for a long table in the same batch to end.

Running sequences always fill slots 0..n-1 (`running[i].slot == i`): when one finishes,
the sequence in the last slot moves into its place (its KV moves with it), so every pass
reads the cache as a view of its first n slots instead of gathering rows.

`apply` is the one place a round's outcome reaches a sequence: its tokens are committed
until it finishes (model/decode/stopping.py, the reference decoders' rule), its statistics
counted as the reference counts them, and its slot keeps the KV of committed tokens only.
"""

from __future__ import annotations

from collections import deque

from gravityocr.model.engine.kv_cache import SlotKVCache
from gravityocr.model.engine.rounds import Outcome
from gravityocr.model.engine.sequence import Sequence


class Scheduler:
    def __init__(self, cache: SlotKVCache, max_slots: int):
        self.cache = cache
        self.max_slots = max_slots
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # running[i] occupies slot i

    def add(self, sequence: Sequence) -> None:
        self.waiting.append(sequence)

    def admit(self) -> list[Sequence]:
        """Move waiting sequences into the free slots, oldest first; returned in slot order.
        Among those admitted together the longest prompt takes the first slot: a prefill
        pass over consecutive slots then holds prompts of similar length, and pads few
        (`prefill_groups`)."""
        admitted = []
        while self.waiting and len(self.running) + len(admitted) < self.max_slots:
            admitted.append(self.waiting.popleft())
        admitted.sort(key=lambda s: s.request.prompt.length, reverse=True)  # stable: ties keep their age
        for sequence in admitted:
            sequence.slot = len(self.running)
            self.running.append(sequence)
        return admitted

    def apply(self, sequence: Sequence, outcome: Outcome) -> tuple[int, int]:
        """Commit one round's outcome; returns (forward passes, tokens committed) for it.
        A sequence that finishes at its draft pass's y never ran its verify pass, as in the
        reference: that pass is not counted and its accepted count is 0."""
        before, passes = len(sequence.tokens), 0
        if outcome.y is not None:
            passes += 1  # its own draft pass
            sequence.commit([outcome.y])
        if outcome.y is not None and sequence.finished:
            sequence.stats.accepted_per_round.append(0)
        else:
            passes += 1
            committed_before = len(sequence.tokens)
            sequence.commit(outcome.tokens)
            if outcome.accepted is not None:  # none past an eos or the length
                accepted = min(outcome.accepted, len(sequence.tokens) - committed_before)
                sequence.stats.accepted_per_round.append(accepted)
                sequence.stats.count_drafted(outcome.source, accepted)
                sequence.recent_accepted.append(accepted)
        sequence.stats.forward_passes += passes
        sequence.stats.ar_rounds += outcome.ar
        sequence.drafts = outcome.drafts
        if outcome.first_position is not None:
            sequence.first_position = outcome.first_position
        if outcome.reading is not None:
            sequence.reading = outcome.reading
        if outcome.scorer is not None:
            sequence.scorer = outcome.scorer
        self.cache.keep(sequence.slot, outcome.kv_length)
        return passes, len(sequence.tokens) - before

    def release_finished(self, sequences: list[Sequence]) -> list[Sequence]:
        """Free the slots of those of `sequences` that are finished; returns them."""
        # Highest slot first: a finished sequence in the last slot then never moves.
        done = sorted((s for s in sequences if s.finished), key=lambda s: s.slot, reverse=True)
        for sequence in done:
            self.release(sequence)
        return done

    def release(self, sequence: Sequence) -> None:
        """Free `sequence`'s slot (finished or aborted); the sequence in the last slot moves
        into it, its KV with it."""
        freed, last = sequence.slot, self.running.pop()
        self.cache.free(freed)
        if last is not sequence:
            moved_from, last.slot = last.slot, freed
            self.running[freed] = last
            self.cache.move(moved_from, freed)

    def withdraw(self, sequence: Sequence) -> None:
        """Take a sequence that was never admitted out of the queue."""
        self.waiting = deque(s for s in self.waiting if s is not sequence)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)


# A prefill pass pads every row to its longest; rows are cut into passes while padding
# stays under this share of a pass's real tokens (a pass's fixed cost is small beside it).
PREFILL_PADDING = 0.1


def prefill_groups(lengths: list[int]) -> list[range]:
    """Consecutive rows cut into the prefill passes they run in. A pass pads its rows to
    its longest; a row joins the pass while the padding stays within PREFILL_PADDING of
    the pass's real tokens. Rows are independent in a pass, so the cut changes no row's
    tokens, only the padding computed; it pays where the rows come longest first, as
    `Scheduler.admit` orders them."""
    groups, start, total, longest = [], 0, 0, 0
    for i, length in enumerate(lengths):
        if i > start and (i - start + 1) * max(longest, length) > (1 + PREFILL_PADDING) * (total + length):
            groups.append(range(start, i))
            start, total, longest = i, 0, 0
        total, longest = total + length, max(longest, length)
    if lengths:
        groups.append(range(start, len(lengths)))
    return groups
