"""StreamText: streamed deltas join to the whole decode, hold back half characters, and
cost time linear in the tokens."""

import random

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from serve.stream_text import StreamText

# Prose, code, a formula and characters of two, three and four UTF-8 bytes.
TEXT = ("Résumé of § 4.2: ∑_{i=1}^{n} x_i ≤ 10 — naïve café, 東京 ½ 🙂 def f(x):\n    return x ** 2  "
        "<table><tr><td>Größe</td><td>λ = 0.5</td></tr></table>")


@pytest.fixture(scope="module")
def byte_level_tokenizer() -> Tokenizer:
    """A byte-level BPE (the GLM-OCR hub tokenizer's kind) trained on ASCII only, so every
    non-ASCII character above is split across byte tokens."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(["the table reads x = 10 and return x ** 2 in def f(x)"] * 20, trainer)
    return tokenizer


def _stream(decode, token_ids: list[int], rounds: list[int]) -> list[str]:
    text = StreamText(decode)
    pieces, start = [], 0
    for size in rounds:
        pieces.append(text.add(token_ids[start:start + size]))
        start += size
    pieces.append(text.rest(token_ids))
    return pieces


def _random_rounds(rng: random.Random, total: int) -> list[int]:
    rounds = []
    while sum(rounds) < total:
        rounds.append(rng.randint(1, 6))  # 1 (AR) to several tokens (a speculative round)
    return rounds


@pytest.mark.parametrize("seed", range(5))
def test_byte_level_deltas_join_to_the_whole_decode_without_half_characters(byte_level_tokenizer, seed):
    token_ids = byte_level_tokenizer.encode(TEXT).ids
    assert len(token_ids) > len(TEXT.encode()) // 3  # the non-ASCII characters really are split into bytes
    pieces = _stream(byte_level_tokenizer.decode, token_ids, _random_rounds(random.Random(seed), len(token_ids)))
    assert "".join(pieces) == byte_level_tokenizer.decode(token_ids) == TEXT
    assert not any("\ufffd" in piece for piece in pieces)


def test_half_a_character_is_held_back_until_the_next_round(byte_level_tokenizer):
    token_ids = byte_level_tokenizer.encode("a東").ids
    assert len(token_ids) == 4  # "a" and the three bytes of 東
    text = StreamText(byte_level_tokenizer.decode)
    assert text.add(token_ids[:1]) == "a"
    assert text.add(token_ids[1:3]) == ""
    assert text.add(token_ids[3:]) == "東"
    assert text.rest(token_ids) == ""


@pytest.mark.parametrize("seed", range(3))
def test_shipped_tokenizer_deltas_join_to_the_whole_decode(processor, seed):
    token_ids = processor.tokenizer.encode(TEXT, add_special_tokens=False)
    pieces = _stream(processor.decode, token_ids, _random_rounds(random.Random(seed), len(token_ids)))
    assert "".join(pieces) == processor.decode(token_ids)


def test_decoding_work_is_linear_in_the_tokens(byte_level_tokenizer):
    """Each round decodes the untold tokens and the round before them, not the whole list:
    3000 tokens in rounds of 3 decode about 3 tokens per token (the whole list each round
    would be about 1500)."""
    token_ids = (byte_level_tokenizer.encode(TEXT).ids * 40)[:3000]
    decoded = []

    def counting_decode(ids: list[int]) -> str:
        decoded.append(len(ids))
        return byte_level_tokenizer.decode(ids)

    pieces = _stream(counting_decode, token_ids, [3] * 1000)
    assert "".join(pieces) == byte_level_tokenizer.decode(token_ids)
    assert sum(decoded[:-1]) <= 4 * len(token_ids)  # the last call is rest()'s one whole decode
