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

Exactness is untouched: every committed token is still the causal model's argmax given
the committed tokens before it; the masks only choose what the next round verifies. A
round takes one pass instead of two but commits fewer tokens (its drafts come from a
block of L <= B masks, and x's own AR token is no longer free), so it pays where a pass
costs about the same whatever its length: one sequence at a time (lower latency). In large
batches on a CPU, where a pass costs by its tokens, classic rounds decode faster
(`gravityocr bench decode --draft-ahead 16` shows both: on the held-out set, 2 CPU
threads, batch 1: 630 vs 582 tokens/s; batch 8: 920 vs 1219; batch 32: 842 vs 1264).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DraftAhead:
    block: int = 16  # masks per anchored block (L); at most the draft block B
    confidence: float = 0.7  # a draft this probable is expected to be accepted
    most_anchors = 3

    def __post_init__(self):
        if self.block < 2:
            raise ValueError(f"draft-ahead block must be at least 2, got {self.block}")
        if not 0 < self.confidence < 1:
            raise ValueError(f"draft-ahead confidence must lie in (0, 1), got {self.confidence}")

    def check_fits(self, block_size: int) -> None:
        """The prefill drafts B tokens; a round's blocks draft L each: L > B buys nothing."""
        if self.block > block_size:
            raise ValueError(f"draft-ahead block {self.block} is longer than the draft block {block_size}")

    @property
    def most_masks(self) -> int:
        """Mask tokens in one round's input at most (a cache slot keeps room for them)."""
        return self.most_anchors * self.block

    def anchors(self, confident: list[bool]) -> list[int]:
        """Anchor positions among [x, e_1..e_n] (0 = x) for drafts whose confidence flags
        are `confident`: x, the end of the leading confident drafts, and one draft further."""
        expected = 0
        while expected < len(confident) and confident[expected]:
            expected += 1
        return sorted({0, expected, min(expected + 1, len(confident))})

    def confident(self, logits: torch.Tensor) -> torch.Tensor:
        """Per position: is the argmax at least `confidence` probable (log-space: no
        softmax over the vocabulary is kept)."""
        return logits.max(-1).values - torch.logsumexp(logits, -1) >= math.log(self.confidence)


@dataclass(frozen=True)
class RoundLayout:
    """Where each token of one round's input [x, drafts, blocks] sits and what it sees."""

    tokens: list[int]  # x, the drafts, then mask ids
    offsets: list[int]  # rope position minus x's
    sees_through: list[int]  # index (in this input) of the last causal token it sees
    own_block: list[tuple[int, int]]  # [start, end) of its mask block in this input; (0, 0) for x and drafts
    anchors: list[int]
    block_starts: list[int]  # index of each anchor's first mask

    @classmethod
    def build(cls, x: int, drafts: list[int], anchors: list[int], block: int, mask_id: int) -> "RoundLayout":
        n = len(drafts)
        tokens, offsets = [x] + drafts, list(range(n + 1))
        sees_through, own_block = list(range(n + 1)), [(0, 0)] * (n + 1)
        block_starts = []
        for anchor in anchors:
            start = len(tokens)
            block_starts.append(start)
            tokens += [mask_id] * block
            offsets += [anchor + 1 + i for i in range(block)]
            sees_through += [anchor] * block
            own_block += [(start, start + block)] * block
        return cls(tokens, offsets, sees_through, own_block, anchors, block_starts)

    def attention(self, width: int | None = None, device=None) -> torch.Tensor:
        """(width, width) bool among this input's tokens, padded: padding sees what is
        before it (never seen by a real token)."""
        return rounds_attention([self], width or len(self.tokens), device)[0]

    def next_drafts(self, accepted: int, predicted: list[int], confident: list[bool],
                    block: int) -> tuple[list[int], list[bool]]:
        """Drafts (and confidence flags) for the round after one that accepted `accepted`
        drafts, from the block of the nearest anchor at or below it: its mask i drafts
        the token at offset anchor + 1 + i; the next round's drafts start at offset
        accepted + 2 (after the bonus token)."""
        index = max(i for i, anchor in enumerate(self.anchors) if anchor <= accepted)
        first = self.block_starts[index] + accepted + 1 - self.anchors[index]
        end = self.block_starts[index] + block
        return predicted[first:end], confident[first:end]


def rounds_attention(layouts: list[RoundLayout], width: int, device=None) -> torch.Tensor:
    """(n, width, width) `attention` of several rounds' inputs padded to `width`, built from
    three host lists in one host-to-device copy each (a batched round's hot path)."""
    sees_through, starts, ends = [], [], []
    for layout in layouts:
        length = len(layout.tokens)
        sees_through.append(layout.sees_through + list(range(length, width)))
        starts.append([start for start, _ in layout.own_block] + [0] * (width - length))
        ends.append([end for _, end in layout.own_block] + [0] * (width - length))
    sees_through, starts, ends = (torch.tensor(values, device=device)[..., None] for values in (sees_through, starts, ends))
    key = torch.arange(width, device=device)
    return (key <= sees_through) | ((key >= starts) & (key < ends))


def accepted_prefix(drafts: list[int], predictions: list[int]) -> int:
    """Length of the longest draft prefix equal to the AR predictions before each draft."""
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == predictions[accepted]:
        accepted += 1
    return accepted
