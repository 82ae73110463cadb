"""A slot-based static KV cache with per-slot lengths, for many sequences at once.

Memory is allocated once, (max_batch_size, kv_heads, capacity, head_dim) per layer, so
what the engine may use is known before the first request. Each slot holds one sequence;
`lengths[slot]` is how many of its tokens' KV belong to the sequence. The n running
sequences occupy slots 0..n-1 (the scheduler compacts), so a pass over them writes each
row's new tokens' KV at the row's own length and returns a view up to the longest row;
the 4-D attention mask (`rows_attention_mask`) hides whatever a row must not see:
another sequence's leftovers beyond its length, dropped mask tokens, rejected drafts.
Rolling back is lowering a length: KV past it is garbage that is never attended to and
is overwritten by the next pass.

GLM-OCR's attention calls `cache.update(key_states, value_states, layer_idx, ...)`;
with an explicit 4-D mask transformers' mask helpers return that mask untouched, so this
plain object is all the decoder needs.
"""

from __future__ import annotations

import torch

from gravityocr.model.engine.config import CacheTooLarge, EngineConfig


def _free_memory_bytes(device: torch.device) -> int | None:
    """Bytes that may still be allocated on `device` (None when unknown)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    if device.type != "cpu":
        return None
    free = None
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
    except OSError:
        pass
    try:  # a container's own limit may be lower than the machine's free memory
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            used = int(f.read().strip())
        if limit != "max":
            free = min(free, int(limit) - used) if free is not None else int(limit) - used
    except (OSError, ValueError):
        pass
    return free


class SlotKVCache:
    """KV of up to `max_slots` sequences; see the module docstring."""

    # Share of free memory the cache may take: activations of the passes need the rest.
    MAX_FREE_MEMORY_SHARE = 0.8

    def __init__(self, num_layers: int, max_slots: int, kv_heads: int, head_dim: int, capacity: int,
                 dtype: torch.dtype, device: torch.device | str):
        device = torch.device(device)
        needed = self.bytes_needed(num_layers, max_slots, kv_heads, head_dim, capacity, dtype)
        free = _free_memory_bytes(device)
        if free is not None and needed > self.MAX_FREE_MEMORY_SHARE * free:
            raise CacheTooLarge(
                f"a KV cache of {max_slots} slots x {capacity} tokens needs {needed / 2**30:.2f} GiB, but only "
                f"{free / 2**30:.2f} GiB is free on {device} (the cache may take {self.MAX_FREE_MEMORY_SHARE:.0%}); "
                f"lower max_batch_size or max_seq_len"
            )
        shape = (max_slots, kv_heads, capacity, head_dim)
        # Zeros, not empty: masked keys still enter the softmax product as 0 * value, and
        # uninitialised memory could hold NaN, which would turn that 0 into NaN.
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        # host-side: tokens of KV that belong to each slot's sequence; written only by the
        # methods below (`keep`, `free`, `move`)
        self.lengths = [0] * max_slots
        self.capacity = capacity
        self.device = device
        self._rows: torch.Tensor | None = None
        self._write_positions: torch.Tensor | None = None
        self._read_len = 0
        self._first_slot = 0

    @classmethod
    def for_model(cls, text_config, config: EngineConfig) -> "SlotKVCache":
        head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // text_config.num_attention_heads
        return cls(text_config.num_hidden_layers, config.max_batch_size, text_config.num_key_value_heads, head_dim,
                   config.slot_capacity, config.dtype, config.device)

    @staticmethod
    def bytes_needed(num_layers, max_slots, kv_heads, head_dim, capacity, dtype) -> int:
        element = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * max_slots * kv_heads * capacity * head_dim * element

    def plan(self, past: torch.Tensor, new_tokens: int, read_len: int, first_slot: int = 0) -> None:
        """Set up the next forward pass over n = len(past) consecutive slots from
        `first_slot`: row i writes `new_tokens` KV at `past[i]` of slot first_slot + i, and
        every row reads KV up to `read_len`."""
        if read_len > self.capacity:
            raise RuntimeError(f"pass reads {read_len} tokens, slot capacity is {self.capacity}")
        n = past.shape[0]
        self._rows = first_slot + torch.arange(n, device=past.device)[:, None]
        self._write_positions = past[:, None] + torch.arange(new_tokens, device=past.device)
        self._read_len = read_len
        self._first_slot = first_slot

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Called by each attention layer: store the new KV, return the rows' KV so far."""
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        keys[self._rows, :, self._write_positions] = key_states.transpose(1, 2).to(keys.dtype)
        values[self._rows, :, self._write_positions] = value_states.transpose(1, 2).to(values.dtype)
        rows = slice(self._first_slot, self._first_slot + self._rows.shape[0])
        return keys[rows, :, :self._read_len], values[rows, :, :self._read_len]

    def keep(self, slot: int, length: int) -> None:
        """The slot's first `length` tokens' KV is its sequence's: a pass's new KV up to there
        is committed, anything after it (masks, rejected drafts, padding) rolled back."""
        if not 0 <= length <= self.capacity:
            raise ValueError(f"slot {slot}: cannot keep {length} tokens of a {self.capacity}-token slot")
        self.lengths[slot] = length

    def free(self, slot: int) -> None:
        """The slot holds no sequence any more."""
        self.lengths[slot] = 0

    def move(self, source: int, destination: int) -> None:
        """Move a sequence's KV to another slot (compaction after a sequence finishes)."""
        n = self.lengths[source]
        for keys, values in zip(self.keys, self.values):
            keys[destination, :, :n] = keys[source, :, :n]
            values[destination, :, :n] = values[source, :, :n]
        self.lengths[destination], self.lengths[source] = n, 0

    def slot_kv(self, slot: int, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The KV that counts as slot's sequence: (kv_heads, length, head_dim) each."""
        n = self.lengths[slot]
        return self.keys[layer_idx][slot, :, :n], self.values[layer_idx][slot, :, :n]


def rows_attention_mask(past: torch.Tensor, new_pattern: torch.Tensor, read_len: int) -> torch.Tensor:
    """(n, 1, q, read_len) bool mask for a pass whose row i has `past[i]` cached tokens and
    q new tokens placed right after them.

    A new token sees all of its row's cache, the new tokens `new_pattern[i]` (q, q) allows,
    and nothing at or beyond past[i] + q (stale KV of the slot). `new_pattern` may also be
    (q, q), shared by all rows. Every row of the pattern must allow at least one token, so
    that no softmax row is empty.
    """
    n, q = past.shape[0], new_pattern.shape[-1]
    keys = torch.arange(read_len, device=past.device)
    relative = keys[None, :] - past[:, None]  # (n, read_len): index among the new tokens
    cached = relative < 0
    is_new = (relative >= 0) & (relative < q)
    pattern = new_pattern.expand(n, q, q)
    allowed_new = pattern.gather(2, relative.clamp(0, q - 1)[:, None, :].expand(n, q, read_len))
    return (cached[:, None, :] | (is_new[:, None, :] & allowed_new))[:, None]
