"""Which structure a response's drafts are kept to, by its task (model/decode/structured_drafts.py)."""

from __future__ import annotations

from dataclasses import dataclass

from gravityocr.model.decode.formula_drafts import CommandShape, LatexNames


@dataclass(frozen=True)
class DraftRules:
    """The tokenizer's ids for LaTeX's command names; None where its tokens do not allow it."""

    latex: LatexNames | None

    @classmethod
    def of(cls, tokenizer) -> "DraftRules | None":
        rules = cls(LatexNames.of(tokenizer))
        return rules if rules.latex is not None else None

    def shape_for(self, task: str):
        """A fresh shape for a response to `task`: LaTeX command names in a formula; None
        for other tasks, or if not available."""
        if task == "formula" and self.latex is not None:
            return CommandShape(self.latex)
        return None
