"""Single-sequence decoding: greedy AR and self-speculative (draft + verify), the reference
semantics that the batched engine must reproduce token for token.

A self-speculative round starts from the last committed token x, which is not yet in
the KV cache:
  1. draft pass  [x, M x B]: x's output is the AR token y; the masks' outputs are drafts
     d_1..d_B for the B positions after x (d_1 drafts y's position, so it is not used).
     Only x's KV is kept.
  2. verify pass [y, d_2..d_B] under causal attention: the longest draft prefix equal
     to the AR predictions is accepted; y, the accepted drafts and the next AR token (the
     bonus, the next round's x) are committed. KV is kept for committed tokens only.
The first round needs no draft pass: the prefill runs B masks after the prompt (they see
the image and prompt and each other, as a block at the start of the response does in
training), so it yields the first token y_0 and drafts for the tokens after it, and the
first round is a verify pass [y_0, drafts] alone.
Every committed token is the greedy choice of the causal model given the committed tokens
before it (the argmax; on a one-strip text line of a model with `ctc_prefix_weight`, the
joint CTC/attention choice, model/decode/ctc_prefix.py), so the output equals greedy AR
decoding of the same weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers.cache_utils import DynamicCache

from gravityocr.model.decode.attention import causal_attention_mask, draft_attention_mask
from gravityocr.model.decode.ctc_prefix import CTCPrefixScorer, greedy_tokens, line_scorer
from gravityocr.model.network.modeling import GravityOcrForConditionalGeneration
from gravityocr.model.network.processor import EncodedPrompt
from gravityocr.model.decode.stopping import stop_reason
from gravityocr.model.decode.draft_rules import DraftRules
from gravityocr.model.decode.reading_drafts import DRAFTED_TASKS, NO_COPY, ReadingIndex, reading_with_eos
from gravityocr.model.decode.structured_drafts import kept_to_structure


@dataclass
class DecodeStats:
    committed_tokens: int = 0
    forward_passes: int = 0  # prefill included; for AR, passes == tokens
    accepted_per_round: list[int] = field(default_factory=list)  # one per speculative round
    # Rounds that committed one AR token each: every round of AR decoding, and those of a
    # speculative decode that ran in a batch past EngineConfig.speculative_max_batch.
    ar_rounds: int = 0
    # Committed tokens that were accepted drafts, by where the drafts came from (DRAFT_SOURCES);
    # the other committed tokens are each pass's own greedy token (AR, y, bonus).
    drafted_tokens: dict[str, int] = field(default_factory=dict)

    @property
    def tokens_per_forward(self) -> float:
        return self.committed_tokens / max(1, self.forward_passes)

    def count_drafted(self, source: str, tokens: int) -> None:
        if tokens:
            self.drafted_tokens[source] = self.drafted_tokens.get(source, 0) + tokens

    def committed_by_source(self) -> dict[str, int]:
        """Committed tokens by source: "mask" and "reading" drafts accepted, "ar" the rest."""
        drafted = {source: self.drafted_tokens.get(source, 0) for source in DRAFT_SOURCES}
        return {**drafted, "ar": self.committed_tokens - sum(drafted.values())}


MASK, READING = "mask", "reading"  # where a round's drafts come from: the mask block, or the tower's reading
DRAFT_SOURCES = (MASK, READING)


@dataclass
class DecodeResult:
    token_ids: list[int]  # committed tokens, the eos included when one was produced
    stats: DecodeStats
    finish_reason: str = "length"  # "eos" | "repetition" | "length" (model/decode/stopping.py)


class _Sequence:
    """Committed tokens of one request and the rule for when it is finished."""

    def __init__(self, eos_ids: set[int], max_new_tokens: int, task: str, shape=None):
        self.tokens: list[int] = []
        self.eos_ids = eos_ids
        self.max_new_tokens = max_new_tokens
        self.task = task
        self.shape = shape  # what the committed tokens say of a formula (model/decode/structured_drafts.py)

    @property
    def finish_reason(self) -> str | None:
        return stop_reason(self.tokens, self.eos_ids, self.max_new_tokens, self.task)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def commit(self, tokens: list[int]) -> None:
        for token in tokens:
            if self.finished:
                return
            self.tokens.append(token)
            if self.shape is not None:
                self.shape.feed(token)


@dataclass
class Prefill:
    """What running a prompt into a cache gives."""

    logits: torch.Tensor  # the last prompt position's: the first response token's
    next_position: int  # rope position of the first response token
    draft_logits: torch.Tensor  # the masks' after the first (none without masks)
    # a model with a reading prefix: the reading (with the eos) drafts and copy tokens come from
    reading: ReadingIndex | None = None
    # a line decoded jointly with its CTC prefix scores (model/decode/ctc_prefix.py)
    scorer: CTCPrefixScorer | None = None
    # `from_reading`: the reading's drafts that followed the prompt, and the logits of the
    # last prompt position and of each of them (the greedy token after each)
    reading_drafts: list[int] = field(default_factory=list)
    verify_logits: torch.Tensor | None = None


@torch.no_grad()
def prefill(model: GravityOcrForConditionalGeneration, prompt: EncodedPrompt, cache: DynamicCache,
            eos_ids: set[int] | frozenset[int] = frozenset(), block: int = 0, from_reading: bool = False) -> Prefill:
    """Run image + prompt through the model into `cache`. With `block` masks after the
    prompt at the first response positions: they see the prompt and each other, the prompt
    never sees them, and only the prompt's KV is kept; their logits for the tokens after the
    first one are the drafts (the first mask drafts the first token, which the prompt's
    last logits give exactly). With `from_reading` (a model with a reading prefix), the
    reading's first `block - 1` tokens follow the prompt instead, under causal attention:
    the pass verifies them (`Prefill.verify_logits`), their KV is kept for the caller to cut
    to the accepted ones. `eos_ids`: what ends the reading (drafts and copies come from it),
    and a line decoded jointly with its CTC prefix scores."""
    device = model.device
    input_ids = prompt.input_ids.to(device)
    length = input_ids.shape[1]
    readings: list = []
    frames = [] if model.ctc_prefix_weight else None  # only a model that scores lines needs them
    image_embeds = torch.cat(model.encode_images(prompt.pixel_values.to(device), prompt.image_grid_thw.to(device),
                                                 readings, frames))
    reading = ReadingIndex(reading_with_eos(readings[0], frozenset(eos_ids))) if readings else None
    positions, next_position = model.rope_positions(input_ids, prompt.image_grid_thw.to(device))
    drafts = reading.drafts([], block - 1) if from_reading and reading is not None and block else []
    tail = len(drafts) if from_reading else block
    if tail:
        tail_ids = torch.tensor([drafts], device=device) if from_reading else \
            torch.full((1, block), model.mask_token_id, device=device)
        input_ids = torch.cat([input_ids, tail_ids], 1)
        tail_positions = torch.arange(next_position, next_position + tail, device=device).view(1, 1, -1)
        positions = torch.cat([positions, tail_positions.expand(3, 1, -1)], 2)
    copy_ids = None
    if model.copies_reading and reading is not None:  # the last prompt position predicts the first token
        copy_ids = torch.full_like(input_ids, NO_COPY)
        copy_ids[0, length - 1:length + len(drafts)] = torch.tensor(reading.copy_row(drafts, 0, 1 + len(drafts)))
    embeds = model.embed(input_ids, image_embeds, copy_ids)
    mask = causal_attention_mask(0, length + tail, device)
    if not from_reading:
        mask[length:, length:] = True  # the masks see each other
    logits = model.logits_from_embeds(embeds, positions, mask[None, None], cache, copy_ids)
    if tail and not from_reading:
        cache.crop(-block)
    scorer = line_scorer(model, frames[0] if frames else None, prompt.task, eos_ids)
    if from_reading:
        return Prefill(logits[0, length - 1], next_position, logits[0, :0], reading, scorer, drafts,
                       logits[0, length - 1:length + len(drafts)])
    return Prefill(logits[0, length - 1], next_position, logits[0, length + 1:], reading, scorer)


def _step(model, token_ids: list[int], first_position: int, mask: torch.Tensor, cache: DynamicCache,
          copy_ids: list[int] | None = None) -> torch.Tensor:
    device = model.device
    ids = torch.tensor([token_ids], dtype=torch.long, device=device)
    positions = torch.arange(first_position, first_position + len(token_ids), device=device).view(1, 1, -1).expand(3, 1, -1)
    copies = None if copy_ids is None else torch.tensor([copy_ids], dtype=torch.long, device=device)
    return model.logits_from_embeds(model.embed(ids, None, copies), positions, mask[None, None], cache, copies)[0]


def _copies(reading: ReadingIndex | None, tokens: list[int], first: int, count: int) -> list[int] | None:
    """Copy tokens of `count` inputs whose first is `tokens[first - 1]` (ReadingIndex.copy_row);
    None for a model that does not copy."""
    return None if reading is None else reading.copy_row(tokens, first, count)


def check_length(prompt: EncodedPrompt, max_new_tokens: int, model) -> None:
    """A request must ask for at least one token and fit the model's context."""
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    context = model.config.text_config.max_position_embeddings
    if prompt.length + max_new_tokens > context:
        raise ValueError(
            f"prompt of {prompt.length} tokens plus {max_new_tokens} new tokens exceeds the context of {context}"
        )


@torch.no_grad()
def greedy_decode(model, prompt: EncodedPrompt, max_new_tokens: int, eos_ids: set[int]) -> DecodeResult:
    """Plain greedy AR decoding with a KV cache: one token per forward pass."""
    check_length(prompt, max_new_tokens, model)
    cache = DynamicCache(config=model.config.text_config)
    start = prefill(model, prompt, cache, eos_ids)
    position, scorer = start.next_position, start.scorer
    reading = start.reading if model.copies_reading else None  # what copy tokens come from
    sequence = _Sequence(eos_ids, max_new_tokens, prompt.task)
    stats = DecodeStats(forward_passes=1)
    sequence.commit(greedy_tokens(start.logits[None], scorer, [], 0))
    while not sequence.finished:
        past = cache.get_seq_length()
        k = len(sequence.tokens)
        logits = _step(model, sequence.tokens[-1:], position + k - 1, causal_attention_mask(past, 1, model.device),
                       cache, _copies(reading, sequence.tokens, k, 1))
        stats.forward_passes += 1
        stats.ar_rounds += 1
        sequence.commit(greedy_tokens(logits[-1:], scorer, sequence.tokens, k))
    stats.committed_tokens = len(sequence.tokens)
    return DecodeResult(sequence.tokens, stats, sequence.finish_reason or "length")


@torch.no_grad()
def speculative_decode(model, prompt: EncodedPrompt, max_new_tokens: int, eos_ids: set[int],
                       block_size: int = 32, draft_rules: DraftRules | None = None,
                       reading_drafts: bool = True) -> DecodeResult:
    """Self-speculative decoding; output identical to `greedy_decode` of the same weights.
    Drafts are chosen by content, by the rule the engine ships (model/engine/rounds.py
    `drafts_from_reading`): with a model that has a reading prefix (and `reading_drafts`),
    a text line verifies its reading's next tokens, one pass a round, and a table or a
    formula takes AR steps; a model without a reading drafts with the mask block. With
    `draft_rules`, a formula's drafts are kept to LaTeX's command names
    (model/decode/draft_rules.py) before they are verified."""
    check_length(prompt, max_new_tokens, model)
    if block_size < 2:
        raise ValueError(f"block_size must be at least 2, got {block_size}")
    if reading_drafts and model.reading_prefix is not None:
        return _decode_with_reading(model, prompt, max_new_tokens, eos_ids, block_size, draft_rules,
                                    prompt.task in DRAFTED_TASKS)
    cache = DynamicCache(config=model.config.text_config)
    start = prefill(model, prompt, cache, eos_ids, first_block(block_size, max_new_tokens))
    position, scorer = start.next_position, start.scorer
    reading = start.reading if model.copies_reading else None  # what copy tokens come from
    sequence = _Sequence(eos_ids, max_new_tokens, prompt.task,
                         draft_rules.shape_for(prompt.task) if draft_rules else None)
    stats = DecodeStats(forward_passes=1)
    sequence.commit(greedy_tokens(start.logits[None], scorer, [], 0))
    drafts = kept_to_structure(sequence.shape, start.draft_logits.argmax(-1).tolist())
    if not sequence.finished and drafts:  # the first round: verify [y_0, drafts], no draft pass
        verify_logits = _step(model, sequence.tokens + drafts, position,
                              causal_attention_mask(cache.get_seq_length(), 1 + len(drafts), model.device), cache,
                              _copies(reading, sequence.tokens + drafts, 1, 1 + len(drafts)))
        stats.forward_passes += 1
        _accept(sequence, stats, cache, drafts,
                greedy_tokens(verify_logits, scorer, sequence.tokens + drafts, len(sequence.tokens)))
    mask_id = model.mask_token_id
    while not sequence.finished:
        x_position = position + len(sequence.tokens) - 1
        # No block longer than what may still be committed after y.
        block = max(2, min(block_size, max_new_tokens - len(sequence.tokens)))
        past = cache.get_seq_length()

        # x predicts y, which is committed: it gets its copy token; the masks draft without
        draft_logits = _step(model, sequence.tokens[-1:] + [mask_id] * block, x_position,
                             draft_attention_mask(past, block, model.device), cache,
                             _copies(reading, sequence.tokens, len(sequence.tokens), 1 + block))
        cache.crop(-block)  # keep x only
        stats.forward_passes += 1
        y = greedy_tokens(draft_logits[:1], scorer, sequence.tokens, len(sequence.tokens))[0]
        sequence.commit([y])
        if sequence.finished:
            stats.accepted_per_round.append(0)
            break
        drafts = kept_to_structure(sequence.shape, draft_logits[2:].argmax(-1).tolist())  # d_2..d_B

        verify_logits = _step(model, [y] + drafts, x_position + 1,
                              causal_attention_mask(past + 1, 1 + len(drafts), model.device), cache,
                              _copies(reading, sequence.tokens + drafts, len(sequence.tokens), 1 + len(drafts)))
        stats.forward_passes += 1
        _accept(sequence, stats, cache, drafts,
                greedy_tokens(verify_logits, scorer, sequence.tokens + drafts, len(sequence.tokens)))
    stats.committed_tokens = len(sequence.tokens)
    return DecodeResult(sequence.tokens, stats, sequence.finish_reason or "length")


def _decode_with_reading(model, prompt: EncodedPrompt, max_new_tokens: int, eos_ids: set[int], block_size: int,
                         draft_rules: DraftRules | None, verify_reading: bool) -> DecodeResult:
    """Rounds of a model with a reading, no draft pass: with `verify_reading` the prefill
    verifies the reading's first tokens in its own pass, and each round [x, the reading's
    next block - 1 tokens from the text's place in it] (model/decode/reading_drafts.py);
    where the reading has no place to continue from, or without `verify_reading`, [x] alone
    (an AR step, a round that accepts 0)."""
    cache = DynamicCache(config=model.config.text_config)
    block = first_block(block_size, max_new_tokens) if verify_reading else 0
    start = prefill(model, prompt, cache, eos_ids, block, from_reading=True)
    position, reading, scorer = start.next_position, start.reading, start.scorer
    copying = reading if model.copies_reading else None
    sequence = _Sequence(eos_ids, max_new_tokens, prompt.task,
                         draft_rules.shape_for(prompt.task) if draft_rules else None)
    stats = DecodeStats(forward_passes=1)
    drafts = start.reading_drafts
    predictions = greedy_tokens(start.verify_logits, scorer, drafts, 0)
    if drafts:
        _accept(sequence, stats, cache, drafts, predictions, READING)
    else:  # nothing to verify: the first token alone
        sequence.commit(predictions[:1])
    while not sequence.finished:
        k = len(sequence.tokens)
        block = max(2, min(block_size, max_new_tokens - k))
        room = max(0, max_new_tokens - k - 1)  # no more than may still be committed after the bonus
        drafts = kept_to_structure(sequence.shape, reading.drafts(sequence.tokens, block - 1)[:room]) \
            if verify_reading else []
        verify_logits = _step(model, sequence.tokens[-1:] + drafts, position + k - 1,
                              causal_attention_mask(cache.get_seq_length(), 1 + len(drafts), model.device), cache,
                              _copies(copying, sequence.tokens + drafts, k, 1 + len(drafts)))
        stats.forward_passes += 1
        _accept(sequence, stats, cache, drafts, greedy_tokens(verify_logits, scorer, sequence.tokens + drafts, k),
                READING)
    stats.committed_tokens = len(sequence.tokens)
    return DecodeResult(sequence.tokens, stats, sequence.finish_reason or "length")


def first_block(block_size: int, max_new_tokens: int) -> int:
    """Masks the prefill drafts with: as a round's block after the first token, never
    longer than what may still be committed after it; none if only one token is asked."""
    return max(2, min(block_size, max_new_tokens - 1)) if max_new_tokens > 1 else 0


def _accept(sequence: _Sequence, stats: DecodeStats, cache: DynamicCache, drafts: list[int],
            predictions: list[int], source: str = MASK) -> None:
    """Commit the longest draft prefix equal to the AR predictions (the AR token after the
    verify input's first token, after each draft) and the bonus token after it; the
    cache keeps the KV of committed tokens only."""
    accepted = accepted_prefix(drafts, predictions)
    rejected = len(drafts) - accepted
    if rejected:
        cache.crop(-rejected)
    committed = _commit_accepted(sequence, drafts[:accepted] + [predictions[accepted]], accepted)
    stats.accepted_per_round.append(committed)
    stats.count_drafted(source, committed)


def _commit_accepted(sequence: _Sequence, tokens: list[int], accepted: int) -> int:
    """Commit a round's accepted drafts and bonus token; returns the accepted drafts that
    were committed (none past an eos or the length: the AR model may well agree with
    drafts after its eos, but those are not output)."""
    before = len(sequence.tokens)
    sequence.commit(tokens)
    return min(accepted, len(sequence.tokens) - before)


def accepted_prefix(drafts: list[int], predictions: list[int]) -> int:
    """Length of the longest draft prefix equal to the AR predictions before each draft."""
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == predictions[accepted]:
        accepted += 1
    return accepted
