"""The tasks a crop is read as, each with its prompt and its longest output. Importing this
module does not import torch: commands name the tasks before loading a model."""

from __future__ import annotations

TASK_PROMPTS = {
    "text": "Text Recognition:",
    "table": "Table Recognition:",
    "formula": "Formula Recognition:",
}
# The longest output of each task (tokens; the character tokenizer spends one a character):
# a line of text, a whole table as HTML, one formula. The one place these are set: the
# recogniser's defaults, which every entry point and the evaluation read with.
TASK_TOKEN_BUDGETS = {"text": 256, "table": 1024, "formula": 256}
