"""Character-level tokenizer for the project's own small GLM-OCR-architecture models.

It is a plain `PreTrainedTokenizerFast`, so it saves beside the weights and loads with
`AutoTokenizer`, exactly as GLM-OCR's own tokenizer does. Markup that the recogniser
writes often (HTML table tags) is one token each, so tables cost fewer decode steps.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast


@dataclass(frozen=True)
class SpecialTokens:
    pad: str = "<|pad|>"
    eos: str = "<|endoftext|>"
    unk: str = "<|unk|>"
    mask: str = "<|mask|>"
    image: str = "<|image|>"
    video: str = "<|video|>"
    begin_of_image: str = "<|begin_of_image|>"
    end_of_image: str = "<|end_of_image|>"
    begin_of_video: str = "<|begin_of_video|>"
    end_of_video: str = "<|end_of_video|>"
    assistant: str = "<|assistant|>"

    def all(self) -> list[str]:
        return [
            self.pad, self.eos, self.unk, self.mask, self.image, self.video, self.begin_of_image,
            self.end_of_image, self.begin_of_video, self.end_of_video, self.assistant,
        ]


SPECIAL = SpecialTokens()

# Multi-character pieces of the markup the recogniser emits: one token each.
MARKUP_TOKENS = [
    "<table>", "</table>", "<tr>", "</tr>", "<td>", "</td>", "<th>", "</th>",
    "<thead>", "</thead>", "<tbody>", "</tbody>", ' colspan="', ' rowspan="', '">',
]

# Characters beyond printable ASCII that documents commonly hold.
EXTRA_CHARACTERS = "\n–—‘’“”•…°±×÷€£¥§©®µ·¼½¾éèêëàâäçîïôöùûüñÉÀÇÖÜßæøå"


def character_vocabulary() -> list[str]:
    printable = [c for c in string.printable if c not in "\t\r\x0b\x0c\n"]
    return printable + list(EXTRA_CHARACTERS)


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """A fresh character tokenizer: special tokens first, then markup, then characters."""
    vocab: dict[str, int] = {}
    for token in SPECIAL.all() + MARKUP_TOKENS + character_vocabulary():
        vocab.setdefault(token, len(vocab))
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=SPECIAL.unk))
    # Every character is its own pre-token; added tokens (specials, markup) are matched first.
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=SPECIAL.pad,
        eos_token=SPECIAL.eos,
        unk_token=SPECIAL.unk,
        mask_token=SPECIAL.mask,
        additional_special_tokens=[t for t in SPECIAL.all() if t not in (SPECIAL.pad, SPECIAL.eos, SPECIAL.unk, SPECIAL.mask)],
        clean_up_tokenization_spaces=False,
    )
    tokenizer.add_tokens(MARKUP_TOKENS)
    return tokenizer
