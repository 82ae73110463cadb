"""The engine's rounds as passes: the prefill of newcomers (which verifies the first tokens
of a reading where it drafts from one), a self-speculative round (draft
pass, verify pass, accept the longest agreeing prefix and the bonus token; a sequence that
drafts from its reading prefix verifies without a draft pass) and an AR round,
for many sequences at once. Each returns one `Outcome` per sequence, which the scheduler
applies; none of them changes a sequence or the cache's bookkeeping.

The same steps as the single-sequence reference (`model/decode/reference.py`), batched: a speculative
round has one device-to-host transfer, at its end (on a CPU a second one keeps a formula's
drafts to structure between the two passes, where the drafts are host memory anyway). A
line decoded jointly with its CTC prefix scores (model/decode/ctc_prefix.py) takes its
greedy tokens on the host, from its rows of the logits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gravityocr.model.decode.ctc_prefix import CTCPrefixScorer
from gravityocr.model.decode.reading_drafts import DRAFTED_TASKS, NO_COPY, ReadingIndex
from gravityocr.model.decode.reference import MASK, READING, accepted_prefix
from gravityocr.model.decode.structured_drafts import kept_to_structure
from gravityocr.model.engine.layouts import ar_layout, draft_layout, prefill_layout, running_rows, verify_layout
from gravityocr.model.engine.runner import ModelRunner
from gravityocr.model.engine.sequence import Sequence


@dataclass
class Outcome:
    """What one round gives one sequence."""

    tokens: list[int]  # to commit in order (committing stops where the sequence finishes)
    kv_length: int  # tokens of the slot's KV that stay; the rest of the pass's KV is rolled back
    # speculative rounds: the AR token of the sequence's own draft pass, committed before
    # `tokens` (None: it verified drafts it came with, no draft pass of its own)
    y: int | None = None
    accepted: int | None = None  # speculative rounds: drafts accepted
    ar: bool = False  # an AR round
    drafts: list[int] = field(default_factory=list)  # drafts for the next round (the prefill's)
    reading: ReadingIndex | None = None  # the prefill's: the reading (with its eos) drafts and copies come from
    first_position: int | None = None  # the prefill's: rope position of the first response token
    scorer: CTCPrefixScorer | None = None  # the prefill's: where the line is decoded jointly
    source: str | None = None  # where the drafts it verified came from (reference.DRAFT_SOURCES)


def prefill(runner: ModelRunner, sequences: list[Sequence], blocks: list[int], from_reading: bool) -> list[Outcome]:
    """Image + prompt of each newcomer into its slot; each gets its first response token.
    A row with `blocks[i]` (0: no drafts) drafts for the tokens after it: with
    `from_reading`, a row that drafts from its reading verifies up to `blocks[i] - 1` of its
    reading's first tokens in this same pass (a line the decoder reads as the tower does
    may end here, in one pass), the others masks, whose drafts the first round verifies.
    A model with a reading prefix also gives each row the reading later rounds draft and
    copy from, and a line decoded jointly its CTC prefix scorer (model/decode/ctc_prefix.py)."""
    model = runner.model
    image_embeds, readings, scorers = runner.encode([s.request.prompt for s in sequences])
    drafts = [[] for _ in sequences]
    if from_reading and readings is not None:  # a text line verifies its reading; tables and formulas draw none
        drafts = [reading.drafts([], block - 1) if block and s.request.prompt.task in DRAFTED_TASKS else []
                  for s, reading, block in zip(sequences, readings, blocks)]
        blocks = [0] * len(sequences)
    layout = prefill_layout(model, sequences, image_embeds, blocks, drafts, runner.mask_id, runner.pad_id,
                            runner.device)
    if model.copies_reading:  # each row's last prompt position predicts its first token, its drafts the next
        layout.copy_ids = torch.full_like(layout.ids, NO_COPY)
        for i, (sequence, reading, row_drafts) in enumerate(zip(sequences, readings, drafts)):
            start = sequence.prompt_len - 1
            layout.copy_ids[i, start:start + 1 + len(row_drafts)] = torch.tensor(
                reading.copy_row(row_drafts, 0, 1 + len(row_drafts)), device=runner.device)
    logits = runner.run(layout)
    rows = logits.argmax(-1).tolist()  # the one device-to-host transfer
    for i, scorer in enumerate(scorers):
        if scorer is not None:  # the first token, and the greedy token after each reading draft
            committed = 1 + len(drafts[i])
            rows[i][:committed] = scorer.choose(logits[i, :committed], drafts[i], 0)
    outcomes = []
    for sequence, row, block, row_drafts, reading, first, scorer in zip(
            sequences, rows, blocks, drafts, readings or [None] * len(sequences), layout.first_positions, scorers):
        if row_drafts:  # verified here: the accepted drafts and the bonus token
            a = accepted_prefix(row_drafts, row)
            outcomes.append(Outcome(row_drafts[:a] + [row[a]], kv_length=sequence.prompt_len + a, accepted=a,
                                    first_position=first, reading=reading, scorer=scorer, source=READING))
        else:
            outcomes.append(Outcome([row[0]], kv_length=sequence.prompt_len, drafts=row[1:block],
                                    first_position=first, reading=reading, scorer=scorer))
    return outcomes


def speculative(runner: ModelRunner, sequences: list[Sequence], block_size: int, adaptive: bool,
                structured: bool, from_reading: bool) -> list[Outcome]:
    """Draft pass [x, M x b] then verify pass [y, d_2..d_b] for every row. A row that comes
    with drafts (its prefill's, or with `from_reading` its reading's) verifies [x, drafts]
    instead and its draft-pass row, if the pass runs for others, is ignored. Rows that
    finish at y are verified anyway (the result is ignored), so that no transfer is needed
    between the passes. `structured`: the drafted rows' drafts are kept to their formula's
    structure between the passes. A model that copies its reading needs the drafted rows'
    y and drafts on the host for their copy tokens: one more transfer between the passes,
    in a round where some row drafted here."""
    device = runner.device
    copies = runner.model.copies_reading
    came_with = [_verifiable(s, block_size, adaptive, from_reading) for s in sequences]  # None: drafted here
    blocks = [s.next_block(block_size, adaptive) if d is None else 1 + len(d) for s, d in zip(sequences, came_with)]
    n, width = len(sequences), max(blocks)
    past = running_rows(sequences, runner.cache.lengths)
    as_tensor = lambda values: torch.tensor(values, dtype=torch.long, device=device)
    last_tokens, x_positions = as_tensor([s.tokens[-1] for s in sequences]), as_tensor([s.x_position for s in sequences])
    block_sizes = as_tensor(blocks)
    has_drafts = torch.tensor([d is not None for d in came_with], device=device)
    given = as_tensor([(d or []) + [runner.pad_id] * (width - 1 - len(d or [])) for d in came_with]).view(n, width - 1) \
        if any(d is not None for d in came_with) else None

    if all(d is not None for d in came_with):
        y, drafts = last_tokens, given
    else:
        layout = draft_layout(last_tokens, x_positions, past, block_sizes, width, runner.mask_id)
        if copies:  # x predicts y, which is committed; the masks draft without a copy token
            layout.copy_ids = _copy_ids([s.reading for s in sequences], [s.tokens for s in sequences],
                                        [len(s.tokens) for s in sequences], 1 + width, device)
        draft_logits = runner.run(layout)
        # d_1 drafts y's own position: drafts are d_2..d_width
        y, drafts = draft_logits[:, 0].argmax(-1), draft_logits[:, 2:].argmax(-1)
        for i, (s, d) in enumerate(zip(sequences, came_with)):
            if s.scorer is not None and d is None:  # y is committed: the line's greedy choice
                y[i] = s.scorer.choose(draft_logits[i, :1], s.tokens, len(s.tokens))[0]
        if structured:
            drafts, block_sizes = _kept_to_structure(sequences, came_with, y, drafts, block_sizes, runner.pad_id)
        if given is not None:
            y = torch.where(has_drafts, last_tokens, y)
            drafts = torch.where(has_drafts[:, None], given, drafts)

    # after x, or at x for a row verifying from x (x's KV is written again)
    verify_past = [cached + (1 if d is None else 0) for cached, d in zip(past, came_with)]
    layout = verify_layout(y, drafts, x_positions + 1 - has_drafts.long(), verify_past)
    scored = any(s.scorer is not None for s in sequences)
    if copies or scored:  # input i of a row predicts the token after its text up to that input
        # a row that came with drafts has them on the host; only rows drafted here need theirs
        drafted = layout.ids.tolist() if any(d is None for d in came_with) else None
        texts = [s.tokens + d if d is not None else s.tokens + drafted[i]
                 for i, (s, d) in enumerate(zip(sequences, came_with))]
        firsts = [len(s.tokens) + (d is None) for s, d in zip(sequences, came_with)]
    if copies:
        layout.copy_ids = _copy_ids([s.reading for s in sequences], texts, firsts, width, device)
    verify_logits = runner.run(layout)
    predictions = verify_logits.argmax(-1)
    if scored:  # a jointly decoded line's greedy tokens, over its block
        for i, (s, block) in enumerate(zip(sequences, block_sizes.tolist())):
            if s.scorer is not None:
                predictions[i, :block] = torch.tensor(s.scorer.choose(verify_logits[i, :block], texts[i], firsts[i]),
                                                      device=device)
    in_block = torch.arange(width - 1, device=device)[None, :] < (block_sizes - 1)[:, None]
    agrees = (drafts == predictions[:, :-1]) & in_block
    accepted = agrees.long().cumprod(1).sum(1)  # longest agreeing prefix
    rows = torch.cat([y[:, None], accepted[:, None], drafts, predictions], 1).tolist()  # the one sync

    outcomes = []
    for sequence, cached, row, drafts_given in zip(sequences, past, rows, came_with):
        a, row_drafts, row_predictions = row[1], row[2:1 + width], row[1 + width:]
        drafted_here = drafts_given is None
        # KV kept: x and the accepted drafts (+ y where the row drafted it itself)
        outcomes.append(Outcome(row_drafts[:a] + [row_predictions[a]], kv_length=cached + 1 + drafted_here + a,
                                y=row[0] if drafted_here else None, accepted=a,
                                source=READING if drafts_from_reading(sequence, from_reading) else MASK))
    return outcomes


def ar(runner: ModelRunner, sequences: list[Sequence]) -> list[Outcome]:
    """One greedy token per row: the AR baseline."""
    device = runner.device
    past = running_rows(sequences, runner.cache.lengths)
    last_tokens = torch.tensor([s.tokens[-1] for s in sequences], dtype=torch.long, device=device)
    x_positions = torch.tensor([s.x_position for s in sequences], dtype=torch.long, device=device)
    layout = ar_layout(last_tokens, x_positions, past)
    if runner.model.copies_reading:
        layout.copy_ids = _copy_ids([s.reading for s in sequences], [s.tokens for s in sequences],
                                    [len(s.tokens) for s in sequences], 1, device)
    logits = runner.run(layout)[:, 0]
    tokens = logits.argmax(-1).tolist()
    for i, s in enumerate(sequences):
        if s.scorer is not None:
            tokens[i] = s.scorer.choose(logits[i:i + 1], s.tokens, len(s.tokens))[0]
    return [Outcome([token], kv_length=cached + 1, ar=True) for token, cached in zip(tokens, past)]


def _copy_ids(readings: list[ReadingIndex], texts: list[list[int]], firsts: list[int], width: int,
              device) -> torch.Tensor:
    """(n, width) copy tokens of rows whose input i predicts token `firsts[r] + i` of
    `texts[r]` (ReadingIndex.copy_row, as the reference decoders take them)."""
    rows = [reading.copy_row(text, first, width) for reading, text, first in zip(readings, texts, firsts)]
    return torch.tensor(rows, dtype=torch.long, device=device)


def drafts_from_reading(sequence: Sequence, from_reading: bool) -> bool:
    """Drafts by content: a sequence whose output is its reading's text (a text line of a
    model with a reading) drafts from its reading. A table or a formula of such a model
    takes AR steps: mask drafts for them cost a batch its draft pass and did not pay it back
    with the shipped weights (docs/decoding.md, session 50). A model without a reading drafts
    with the mask block."""
    return from_reading and sequence.reading is not None and sequence.request.prompt.task in DRAFTED_TASKS


def _verifiable(sequence: Sequence, block_size: int, adaptive: bool, from_reading: bool) -> list[int] | None:
    """Drafts a sequence verifies without a draft pass: its reading's (where it drafts from
    its reading, `drafts_from_reading`; none where the reading has no place to continue
    from, and none for a table or a formula of a model with a reading: it then verifies [x]
    alone, an AR step) or its prefill's masks' (its first round); no more than may still be
    committed after the bonus, kept to its formula's structure. None: the round's draft
    pass drafts for it with the mask block."""
    room = max(0, sequence.max_new_tokens - len(sequence.tokens) - 1)
    if from_reading and sequence.reading is not None:
        if not drafts_from_reading(sequence, from_reading):
            return []  # a table or a formula: an AR step in the round
        drafts = sequence.reading.drafts(sequence.tokens, sequence.next_block(block_size, adaptive) - 1)
    elif sequence.drafts:
        drafts = sequence.drafts
    else:
        return None
    kept = kept_to_structure(sequence.shape, drafts[:room])
    return kept if kept or (from_reading and sequence.reading is not None) else None


def _kept_to_structure(sequences: list[Sequence], came_with: list[list[int]], y: torch.Tensor, drafts: torch.Tensor,
                       block_sizes: torch.Tensor, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The draft pass's drafts of rows with a shape kept to the structure that follows their
    y (model/decode/structured_drafts.py); a row's block shrinks where fewer are kept, the padding
    after it never accepted."""
    rows, sizes = drafts.tolist(), block_sizes.tolist()
    for i, (sequence, row_y) in enumerate(zip(sequences, y.tolist())):
        if sequence.shape is None or came_with[i] is not None:
            continue
        after_y = sequence.shape.copy()
        after_y.feed(row_y)
        kept = kept_to_structure(after_y, rows[i][:sizes[i] - 1])
        rows[i] = kept + [pad_id] * (len(rows[i]) - len(kept))
        sizes[i] = 1 + len(kept)
    as_tensor = lambda values: torch.tensor(values, dtype=torch.long, device=drafts.device)
    return as_tensor(rows), as_tensor(sizes)
