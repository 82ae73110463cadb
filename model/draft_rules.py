"""Which structure a response's drafts are kept to, by its task (model/structured_drafts.py)."""

from __future__ import annotations

from dataclasses import dataclass

from .formula_drafts import CommandShape, LatexNames
from .table_drafts import TableShape, TableTokens


@dataclass(frozen=True)
class DraftRules:
    """The tokenizer's ids for each structure; None where its tokens do not allow it."""

    table: TableTokens | None
    latex: LatexNames | None

    @classmethod
    def of(cls, tokenizer, eos_ids) -> "DraftRules | None":
        rules = cls(TableTokens.of(tokenizer, eos_ids), LatexNames.of(tokenizer))
        return rules if rules.table is not None or rules.latex is not None else None

    def shape_for(self, task: str):
        """A fresh shape for a response to `task`: LaTeX command names in a formula, table
        structure elsewhere (tables, and pages that hold them); None if not available."""
        if task == "formula":
            return CommandShape(self.latex) if self.latex is not None else None
        return TableShape(self.table) if self.table is not None else None
