"""The text a growing list of committed tokens adds, round by round, in time linear in the
tokens: each round decodes only the tokens since the last text told plus the round before
them as context (a tokenizer may write a token differently after another, e.g. a word
boundary), never the whole list again."""

from __future__ import annotations

from collections.abc import Callable


class StreamText:
    def __init__(self, decode: Callable[[list[int]], str]):
        self._decode = decode
        self._tokens: list[int] = []
        self._context_start = 0  # where the decoded window starts: the round before the untold tokens
        self._told_end = 0  # tokens before this index are told
        self._told: list[str] = []

    def add(self, token_ids: list[int]) -> str:
        """The text `token_ids` add once it is final, or "" while it is not: half a UTF-8
        character, or a decode that rewrites text already told, is held back until the
        tokens after it settle it."""
        self._tokens.extend(token_ids)
        told = self._decode(self._tokens[self._context_start:self._told_end])
        text = self._decode(self._tokens[self._context_start:])
        if len(text) <= len(told) or not text.startswith(told) or text.endswith("\ufffd"):
            return ""
        self._context_start, self._told_end = self._told_end, len(self._tokens)
        self._told.append(text[len(told):])
        return self._told[-1]

    def rest(self, token_ids: list[int]) -> str:
        """What the whole answer `token_ids` (every token added, in order) adds to the text
        told: the tail held back at the end. "" if the whole decode disagrees with what was
        told (never seen with byte-level or word-level tokenizers)."""
        text = self._decode(token_ids)
        told = "".join(self._told)
        return text[len(told):] if text.startswith(told) else ""
