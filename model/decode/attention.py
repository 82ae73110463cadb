"""Attention masks and rope positions for joint training and self-speculative decoding.

All masks are boolean with True = may attend (sdpa semantics).

Joint training lays one sample out as
    [prefix (image + prompt)] [clean response] [corrupted stream A] [corrupted stream B]
The corrupted streams reuse the clean stream's positions. A corrupted token sees the
prefix, the clean tokens before its block, and its own block in its own stream (both
ways) — exactly what a mask token sees in the draft pass at inference, where the clean
token just before the block is the last committed token x.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PREFIX, CLEAN, STREAM_A, STREAM_B = 0, 1, 2, 3


@dataclass(frozen=True)
class JointLayout:
    """Where each part of one joint-training sequence lies."""

    prefix_len: int
    response_len: int
    block_size: int = 32
    block_offset: int = 0  # shifts block boundaries so training sees blocks starting anywhere
    corrupted_streams: bool = True  # False: AR-only training (prefix + clean stream)

    @property
    def total_len(self) -> int:
        return self.prefix_len + self.response_len * (3 if self.corrupted_streams else 1)

    def stream_start(self, stream: int) -> int:
        return self.prefix_len + (stream - CLEAN) * self.response_len

    def token_kinds(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per token: which part it belongs to, and its response index (-1 in the prefix)."""
        streams = [CLEAN, STREAM_A, STREAM_B] if self.corrupted_streams else [CLEAN]
        response_index = torch.arange(self.response_len)
        kinds = [torch.full((self.prefix_len,), PREFIX)] + [torch.full((self.response_len,), s) for s in streams]
        indices = [torch.full((self.prefix_len,), -1)] + [response_index for _ in streams]
        return torch.cat(kinds), torch.cat(indices)


def joint_attention_mask(layout: JointLayout) -> torch.Tensor:
    """(T, T) mask for one joint-training sequence."""
    kind, index = layout.token_kinds()
    block = torch.div(index + layout.block_offset, layout.block_size, rounding_mode="floor")
    q_kind, k_kind = kind[:, None], kind[None, :]
    q_index, k_index = index[:, None], index[None, :]
    q_block, k_block = block[:, None], block[None, :]
    positions = torch.arange(kind.numel())
    causal = positions[None, :] <= positions[:, None]

    key_is_prefix = k_kind == PREFIX
    prefix_rows = (q_kind == PREFIX) & key_is_prefix & causal
    clean_rows = (q_kind == CLEAN) & (key_is_prefix | ((k_kind == CLEAN) & (k_index <= q_index)))
    corrupted = (q_kind == STREAM_A) | (q_kind == STREAM_B)
    corrupted_rows = corrupted & (
        key_is_prefix
        | ((k_kind == CLEAN) & (k_block < q_block))
        | ((k_kind == q_kind) & (k_block == q_block))
    )
    return prefix_rows | clean_rows | corrupted_rows


def joint_position_ids(prefix_positions: torch.Tensor, first_response_position: int, layout: JointLayout) -> torch.Tensor:
    """(3, T) rope positions: the prefix's own, then each stream at the clean stream's positions."""
    response = torch.arange(layout.response_len, device=prefix_positions.device) + first_response_position
    response = response.view(1, -1).expand(3, -1)
    n_streams = 3 if layout.corrupted_streams else 1
    return torch.cat([prefix_positions] + [response] * n_streams, dim=1)


def complementary_mask_choice(response_len: int, ratio: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """Which response tokens stream A masks (True); stream B masks exactly the others."""
    return torch.rand(response_len, generator=generator) < ratio


def draft_attention_mask(past_len: int, block_size: int, device=None) -> torch.Tensor:
    """(1 + B, past + 1 + B) for the draft pass input [x, M x B]: x is causal (cache and
    itself, never the masks); the masks see the cache, x and each other."""
    mask = torch.ones(1 + block_size, past_len + 1 + block_size, dtype=torch.bool, device=device)
    mask[0, past_len + 1:] = False
    return mask


def causal_attention_mask(past_len: int, new_len: int, device=None) -> torch.Tensor:
    """(n, past + n): new tokens see the whole cache and the new tokens up to themselves."""
    mask = torch.ones(new_len, past_len + new_len, dtype=torch.bool, device=device)
    mask[:, past_len:] = torch.ones(new_len, new_len, dtype=torch.bool, device=device).tril()
    return mask


def pad_square_masks(masks: list[torch.Tensor], total: int) -> torch.Tensor:
    """Stack per-sample (T_i, T_i) masks into (N, 1, total, total); padding rows attend only
    to themselves so that no softmax row is empty."""
    out = torch.zeros(len(masks), 1, total, total, dtype=torch.bool)
    diagonal = torch.eye(total, dtype=torch.bool)
    for i, mask in enumerate(masks):
        n = mask.shape[0]
        out[i, 0] = diagonal
        out[i, 0, :n, :n] = mask
    return out
