"""Drafting ahead inside the verify pass: one forward pass per round instead of two.

A classic round is a draft pass [x, M x B] then a verify pass [y, d_2..d_B]. Drafting
ahead, a round is one pass over [x, e_1..e_n] (x the last committed token, e the drafts
for the tokens after it, written by the round before) followed by blocks of L masks,
each anchored after one candidate end of the accepted prefix:

    [x, e_1, ..., e_n] [M x L anchored at x] [M x L anchored at e_k] [M x L anchored at e_k+1]

x and the drafts are causal, as in a verify pass: their outputs are the AR predictions
that accept the longest agreeing draft prefix e_1..e_a and give the bonus token. A block
anchored at e_j sees the cache, x, e_1..e_j and itself (bidirectionally) at the positions
after e_j: what a block of masks sees in training and in a draft pass, after the clean
tokens x..e_j. When the round accepts a >= j drafts, those are committed tokens, so that
block's outputs are drafts for the next round (the nearest anchor at or below a; its
drafts of positions the round committed are dropped). Anchors: x always (every round then
leaves drafts for the next, even when nothing is accepted), e_k, k = how many leading
drafts were at least `confidence` probable when drafted (the expected acceptance), and
e_k+1 (the first doubtful draft is often right). On a quarter of the held-out set with
the shipped weights: TPF 4.09 with anchors {x, e_k}, 4.33 adding e_k+1, 4.35 adding
e_k+2 too, 4.64 with every draft anchored (a block per draft); confidence 0.5 / 0.7 /
0.85 gave 4.03 / 4.09 / 3.98 with two anchors, L = 8 / 12 / 16 gave 3.78 / 3.95 / 4.03.

Branches (`branches` = N > 0): the drafts are parallel guesses, so where one is wrong its
second choice is often right and the drafts after it still are. Each round then also
verifies, off the main line, a branch per doubtful draft e_j (j = k+1..k+N): [a_j,
e_j+1, ...] (a_j the second choice for e_j, at most L tokens), seeing x..e_j-1 and
itself causally, with a mask block anchored at a_j. The walk accepts e_1..e_a, then the
branch at j = a+1 when the AR token after e_a is a_j, and along it while its drafts agree;
the accepted branch tokens' KV moves to follow e_a in the cache. On the held-out set with
the shipped weights (one sequence at a time, L = 16): TPF 4.27 without branches, 5.09
with N = 4 (text 5.72, table 4.57, formula 4.21); on a quarter of it N = 0 / 1 / 2 / 3 /
4 / 6 gave 4.33 / 4.72 / 4.85 / 5.02 / 5.10 / 5.24; branching instead at the N drafts
whose second choices are the most probable gave 5.04 (N = 4, branches of 32). A branch
lengthens the pass by up to 2L tokens (itself and its block). The drafts are first kept
to the structure being written (model/structured_drafts.py: table tags, LaTeX command
names): TPF 4.42 without branches and 5.31 with N = 4 (tables 4.23 and 5.23, formulas
3.90 and 4.35); longer blocks (L = 24, 32) change nothing for tables.

Tried and left (tables, every third held-out one, shipped weights): anchoring a block at
every draft instead of three, 5.62 -> 6.14 with N = 4 (overall, every fourth item: 5.36 ->
5.66) for up to ~17 blocks per pass; refining drafts as masked diffusion decodes (a block
given the drafts it is confident of, its other masks drafting again) raises a classic
round's accepted drafts 4.01 -> 5.72 (one refining pass) -> 6.82 (two) but costs a pass
each, and folded into these rounds' blocks (given the round's own confident drafts) it
lowered TPF 4.45 -> 3.58: past a round's first wrong draft the drafts are often shifted
by a token (a letter doubled or skipped), and a block given them drafts after them.

Exactness is untouched: every committed token is still the causal model's argmax given
the committed tokens before it; the masks and branches only choose what is verified. A
round takes one pass instead of two but commits fewer tokens (its drafts come from a
block of L <= B masks, and x's own AR token is no longer free), so it pays where a pass
costs about the same whatever its length: one sequence at a time (lower latency). In large
batches on a CPU, where a pass costs by its tokens, classic rounds decode faster
(`gravityocr bench decode --draft-ahead 16` shows both: on the held-out set, 2 CPU
threads, batch 1: 630 vs 582 tokens/s; batch 8: 920 vs 1219; batch 32: 842 vs 1264).
Branches make the pass longer still: `--draft-branches 4`, batch 1, on another machine
of the same kind: AR 206, classic 322, draft-ahead 345, with branches 262 tokens/s at TPF
3.25 / 4.27 / 5.09; they are for devices where a longer pass costs little. With
`EngineConfig.draft_ahead_max_batch` the engine runs these rounds only while few sequences
run and classic rounds above (quarter of the held-out set, 2 CPU threads, table drafts:
draft-ahead vs classic 368 vs 323 tokens/s at batch 1, 618 vs 518 at 2, 637 vs 658 at 4,
622 vs 745 at 8).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .structured_drafts import branch_tails


@dataclass(frozen=True)
class DraftAhead:
    block: int = 16  # masks per anchored block (L); at most the draft block B
    confidence: float = 0.7  # a draft this probable is expected to be accepted
    branches: int = 0  # second-choice branches at the first doubtful drafts (0: none)
    most_anchors = 3  # on the drafts themselves: x, e_k, e_k+1

    def __post_init__(self):
        if self.block < 2:
            raise ValueError(f"draft-ahead block must be at least 2, got {self.block}")
        if not 0 < self.confidence < 1:
            raise ValueError(f"draft-ahead confidence must lie in (0, 1), got {self.confidence}")
        if self.branches < 0:
            raise ValueError(f"draft-ahead branches must be at least 0, got {self.branches}")

    def check_fits(self, block_size: int) -> None:
        """The prefill drafts B tokens; a round's blocks draft L each: L > B buys nothing."""
        if self.block > block_size:
            raise ValueError(f"draft-ahead block {self.block} is longer than the draft block {block_size}")

    @property
    def most_extra_tokens(self) -> int:
        """Tokens of one round's input beyond x and its drafts at most (a cache slot keeps
        room for them): a mask block per anchor, and the branches (L tokens each at most),
        each anchored at its first token."""
        return (self.most_anchors + 2 * self.branches) * self.block

    def expected_accepted(self, confident: list[bool]) -> int:
        """k: how many leading drafts are confident."""
        expected = 0
        while expected < len(confident) and confident[expected]:
            expected += 1
        return expected

    def anchors(self, confident: list[bool]) -> list[int]:
        """Anchor positions among [x, e_1..e_n] (0 = x) for drafts whose confidence flags
        are `confident`: x, the end of the leading confident drafts, and one draft further."""
        expected = self.expected_accepted(confident)
        return sorted({0, expected, min(expected + 1, len(confident))})

    def branch_depths(self, confident: list[bool]) -> list[int]:
        """Drafts (1-based) whose second choice starts a branch: the first `branches`
        doubtful ones, e_k+1 on."""
        expected = self.expected_accepted(confident)
        return list(range(expected + 1, min(expected + self.branches, len(confident)) + 1))

    def layout(self, x: int, drafts: list[int], alternates: list[int], confident: list[bool], mask_id: int,
               shape=None) -> "RoundLayout":
        """One round's input for these drafts (their second choices and confidence flags);
        with `shape` (what the committed tokens say of a table or a formula), the drafts are
        first kept to that structure (model/structured_drafts.py)."""
        alternates, confident, tails = alternates[:len(drafts)], confident[:len(drafts)], None
        if shape is not None:
            repaired = shape.repair(drafts, alternates, confident, keep_shapes=self.branches > 0)
            drafts, alternates, confident = repaired.drafts, repaired.alternates, repaired.confident
        depths = self.branch_depths(confident)
        if shape is not None and depths and repaired.shapes is not None:
            tails = branch_tails(shape, repaired, depths, self.block)
        return RoundLayout.build(x, drafts, self.anchors(confident), self.block, mask_id, alternates, depths, tails)

    def confident(self, logits: torch.Tensor) -> torch.Tensor:
        """Per position: is the argmax at least `confidence` probable (log-space: no
        softmax over the vocabulary is kept)."""
        return logits.max(-1).values - torch.logsumexp(logits, -1) >= math.log(self.confidence)

    def second_choices(self, logits: torch.Tensor) -> torch.Tensor:
        """Per position: the second most probable token (a branch's first token); without
        branches nothing reads them, so zeros spare a top-2 over the vocabulary per token."""
        if not self.branches:
            return torch.zeros(logits.shape[:-1], dtype=torch.long, device=logits.device)
        return logits.topk(2, -1).indices[..., 1]


@dataclass(frozen=True)
class Branch:
    """The second choice for draft e_depth followed by the drafts after it."""

    depth: int  # offset from x of its first token
    start: int  # index of its first token in the round's input
    length: int


@dataclass(frozen=True)
class RoundOutcome:
    """What one round's predictions decide: drafts accepted (along the main drafts, then
    along a branch when the AR token after the accepted ones is that branch's first
    token), the tokens to commit (accepted + bonus), the accepted branch tokens' place in
    the input (their KV follows x and the accepted main drafts in the cache) and the
    anchor whose block drafts the next round."""

    accepted: int
    committed: list[int]
    branch_start: int | None
    branch_accepted: int
    anchor: int  # index into RoundLayout.anchor_depths


@dataclass(frozen=True)
class RoundLayout:
    """Where each token of one round's input [x, drafts, branches, blocks] sits and what it
    sees: token i sees the input's tokens 0..sees_through[i], those in also_sees[i]
    [start, end) (its branch up to itself) and those in own_block[i] (its mask block)."""

    tokens: list[int]  # x, the drafts, the branches, then mask ids
    offsets: list[int]  # rope position minus x's
    sees_through: list[int]
    also_sees: list[tuple[int, int]]  # (0, 0): nothing more
    own_block: list[tuple[int, int]]  # (0, 0) for x, drafts and branch tokens
    draft_count: int
    branches: list[Branch]
    anchor_depths: list[int]  # offset from x of each anchor token
    block_starts: list[int]  # index of each anchor's first mask

    @classmethod
    def build(cls, x: int, drafts: list[int], anchors: list[int], block: int, mask_id: int,
              alternates: list[int] = (), branch_depths: list[int] = (),
              branch_tails: list[list[int]] | None = None) -> "RoundLayout":
        """`anchors`: depths among [x, drafts]; `branch_depths`: drafts (1-based) whose
        second choice (`alternates`, one per draft) starts a branch of at most `block`
        tokens, anchored at its first token, followed by the drafts after the one it
        replaces, or by its `branch_tails` entry (model/structured_drafts.py)."""
        n = len(drafts)
        tokens, offsets = [x] + drafts, list(range(n + 1))
        sees_through, also_sees, own_block = list(range(n + 1)), [(0, 0)] * (n + 1), [(0, 0)] * (n + 1)
        # (depth, sees_through, also_sees) of each anchor token
        anchor_tokens = [(depth, depth, (0, 0)) for depth in anchors]
        branches = []
        for index, depth in enumerate(branch_depths):
            tail = drafts[depth:] if branch_tails is None else branch_tails[index]
            branch_tokens = [alternates[depth - 1]] + tail[:block - 1]
            start = len(tokens)
            branches.append(Branch(depth, start, len(branch_tokens)))
            tokens += branch_tokens
            offsets += [depth + i for i in range(len(branch_tokens))]
            sees_through += [depth - 1] * len(branch_tokens)
            also_sees += [(start, start + i + 1) for i in range(len(branch_tokens))]
            own_block += [(0, 0)] * len(branch_tokens)
            anchor_tokens.append((depth, depth - 1, (start, start + 1)))
        block_starts = []
        for depth, through, seen in anchor_tokens:
            start = len(tokens)
            block_starts.append(start)
            tokens += [mask_id] * block
            offsets += [depth + 1 + i for i in range(block)]
            sees_through += [through] * block
            also_sees += [seen] * block
            own_block += [(start, start + block)] * block
        return cls(tokens, offsets, sees_through, also_sees, own_block, n, branches,
                   [depth for depth, _, _ in anchor_tokens], block_starts)

    def attention(self, width: int | None = None, device=None) -> torch.Tensor:
        """(width, width) bool among this input's tokens, padded: padding sees what is
        before it (never seen by a real token)."""
        return rounds_attention([self], width or len(self.tokens), device)[0]

    def outcome(self, predicted: list[int]) -> RoundOutcome:
        """Walk the drafts, then the branch off the last accepted one, with the AR
        predictions (`predicted[i]`: the argmax after input token i)."""
        drafts = self.tokens[1:1 + self.draft_count]
        accepted = accepted_prefix(drafts, predicted)
        main_anchors = len(self.anchor_depths) - len(self.branches)
        for index, branch in enumerate(self.branches):
            if branch.depth == accepted + 1 and self.tokens[branch.start] == predicted[accepted]:
                taken = 1
                while taken < branch.length and \
                        self.tokens[branch.start + taken] == predicted[branch.start + taken - 1]:
                    taken += 1
                end = branch.start + taken
                return RoundOutcome(accepted + taken, drafts[:accepted] + self.tokens[branch.start:end]
                                    + [predicted[end - 1]], branch.start, taken, main_anchors + index)
        anchor = max(i for i in range(main_anchors) if self.anchor_depths[i] <= accepted)
        return RoundOutcome(accepted, drafts[:accepted] + [predicted[accepted]], None, 0, anchor)

    def next_drafts(self, outcome: RoundOutcome, block: int, *per_token: list) -> tuple[list, ...]:
        """The next round's drafts (and any other per-token lists of this round's outputs:
        predictions, second choices, confidence flags), from the block of the outcome's
        anchor: its mask i drafts the token at offset anchor + 1 + i; the next round's
        drafts start at offset accepted + 2 (after the bonus token)."""
        start = self.block_starts[outcome.anchor]
        first = start + outcome.accepted + 1 - self.anchor_depths[outcome.anchor]
        return tuple(values[first:start + block] for values in per_token)


def rounds_attention(layouts: list[RoundLayout], width: int, device=None) -> torch.Tensor:
    """(n, width, width) `attention` of several rounds' inputs padded to `width`, built from
    five host lists in one host-to-device copy each (a batched round's hot path)."""
    columns = [[], [], [], [], []]  # sees_through, also_sees start/end, own_block start/end
    for layout in layouts:
        pad = range(len(layout.tokens), width)
        columns[0].append(layout.sees_through + list(pad))
        for column, (intervals, side) in enumerate(((layout.also_sees, 0), (layout.also_sees, 1),
                                                    (layout.own_block, 0), (layout.own_block, 1)), 1):
            columns[column].append([interval[side] for interval in intervals] + [0] * len(pad))
    through, also_start, also_end, block_start, block_end = (
        torch.tensor(values, device=device)[..., None] for values in columns)
    key = torch.arange(width, device=device)
    return (key <= through) | ((key >= also_start) & (key < also_end)) | ((key >= block_start) & (key < block_end))


def accepted_prefix(drafts: list[int], predictions: list[int]) -> int:
    """Length of the longest draft prefix equal to the AR predictions before each draft."""
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == predictions[accepted]:
        accepted += 1
    return accepted
