"""A chat answer for a table is one closed table, streamed or not (serve/table_answer.py)."""

from __future__ import annotations

import asyncio
import json
import random
import time
from concurrent.futures import Future
from types import SimpleNamespace

import pytest

from gravityocr.model.evaluation.scores import parse_table
from gravityocr.serve.chat_stream import _END, ChatStream
from gravityocr.serve.table_answer import closed_table, unfinished_tag

# The shipped tokenizer writes these as single tokens and spells other tags and attributes
# out: a budget can end an answer inside a tag.
PIECES = ["<table>", "<tr>", "<td>", "</td>", "</tr>", "</table>", "<th>", "</th>", "<thead>", "</thead>", "<",
          "/", "t", "d", "r", ' colspan="', ' rowspan="', "2", '">', "a", "b", " ", "x < y"]


@pytest.mark.parametrize("text,closed", [
    ("<table><tr><td>a</td></tr></table>", "<table><tr><td>a</td></tr></table>"),
    ("<table><tr><td>a</td></tr><tr><td>b", "<table><tr><td>a</td></tr><tr><td>b</td></tr></table>"),
    ("<table><tr><td>a</t", "<table><tr><td>a</td></tr></table>"),
    ("<table><tr><td>a</td><", "<table><tr><td>a</td></tr></table>"),
    ('<table><tr><td colspan="2', "<table><tr></tr></table>"),
    ('<table><tr><td colspan="2">a', '<table><tr><td colspan="2">a</td></tr></table>'),
    ("<table><thead><tr><th>a</th>", "<table><thead><tr><th>a</th></tr></thead></table>"),
    ("<table><tr><td>x < y", "<table><tr><td>x < y</td></tr></table>"),  # a `<` that opens no tag is text
    ("<table><tr><td>a</tr><td>b", "<table><tr><td>a</tr><td>b</td></table>"),  # </tr> closes the cell it held
    ("", ""),
])
def test_closed_table_drops_an_unfinished_tag_and_closes_what_is_open(text, closed):
    assert closed_table(text) == closed
    assert closed_table(closed) == closed


def test_unfinished_tag_finds_where_a_tag_begun_at_the_end_starts():
    assert unfinished_tag("<td>a</t") == 5 and unfinished_tag("<td>a<") == 5 and unfinished_tag('a<td rowspan="3') == 1
    assert unfinished_tag("<td>a</td>") == 10 and unfinished_tag("x < y") == 5 and unfinished_tag("") == 0


def _streamed(token_rounds: list[list[int]], task: str) -> tuple[str, str]:
    """(the chunks' joined content, the finish reason) of a ChatStream fed these rounds."""
    decode = lambda ids: "".join(PIECES[i] for i in ids)  # noqa: E731
    tokens = [t for r in token_rounds for t in r]

    async def run() -> list[str]:
        queue: asyncio.Queue = asyncio.Queue()
        for round_tokens in token_rounds:
            queue.put_nowait(round_tokens)
        queue.put_nowait(_END)
        future: Future = Future()
        future.set_result(SimpleNamespace(token_ids=tokens, finish_reason="length",
                                          stats=SimpleNamespace(tokens_per_forward=1.0, accepted_per_round=[])))
        stream = ChatStream(future, queue, completion_id="c", created=0, model="m", prompt_tokens=1, task=task,
                            include_usage=False)
        return [line async for line in stream.events(decode, time.perf_counter() + 60)]

    events = [json.loads(line[len("data: "):]) for line in asyncio.run(run()) if "[DONE]" not in line]
    content = "".join(e["choices"][0]["delta"].get("content", "") for e in events)
    return content, events[-1]["choices"][0]["finish_reason"]


def test_a_streamed_table_joins_into_the_closed_answer_whatever_the_rounds():
    """Random answers cut anywhere (inside tags too), split into random rounds: the chunks
    join into `closed_table` of the whole text, as the non-streamed answer is, and never
    hand out an unfinished tag that a later chunk would have to take back."""
    rng = random.Random(0)
    for _ in range(300):
        tokens = [rng.randrange(len(PIECES)) for _ in range(rng.randint(0, 30))]
        splits = sorted(rng.sample(range(1, len(tokens)), k=min(len(tokens) - 1, rng.randint(0, 6)))) \
            if len(tokens) > 1 else []
        rounds = [tokens[a:b] for a, b in zip([0, *splits], [*splits, len(tokens)])]
        whole = "".join(PIECES[i] for i in tokens)
        content, finish = _streamed(rounds, "table")
        assert content == closed_table(whole) and finish == "length"
        if whole.startswith("<table>"):
            assert parse_table(content) is not None
    text_rounds = [[0, 12, 1], [10, 13]]  # other tasks stream the model's text as it is
    assert _streamed(text_rounds, "text")[0] == "<table>t<tr><d"
