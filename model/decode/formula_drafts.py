"""Drafts of LaTeX command names, kept to names LaTeX has.

A character tokenizer writes `\\epsilon` as eight tokens, and the drafter, writing a
block's tokens in parallel, knows a command comes but not its letters' exact places (how
often a round stopped inside a command name, and what keeping the drafts to names bought:
docs/decoding.md). Given the letters committed after the backslash, a run of drafted
letters that spells no command is replaced by the command whose rest is nearest to it (edit
distance; ties to the commoner command): `\\eppsiln` drafts `\\epsilon`, `\\sqr{` drafts
`\\sqrt{`. Letters after a committed start that no listed command has are left as drafted.

Output is unchanged: drafts only choose what is verified.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from rapidfuzz.distance import Levenshtein


# Math-mode command names, commonest first (ties in the choice go to the earlier one).
COMMANDS = tuple("""
frac sqrt sum int prod lim infty times cdot pm mp to leq geq neq approx equiv sim propto in notin
subset subseteq cup cap forall exists partial nabla alpha beta gamma delta epsilon varepsilon zeta
eta theta vartheta iota kappa lambda mu nu xi pi rho sigma tau upsilon phi varphi chi psi omega
Gamma Delta Theta Lambda Xi Pi Sigma Upsilon Phi Psi Omega exp log ln sin cos tan sec csc cot
arcsin arccos arctan sinh cosh tanh max min sup inf det dim ker arg deg gcd ldots cdots vdots ddots
left right langle rangle lfloor rfloor lceil rceil hat bar vec dot ddot tilde overline underline
mathrm mathbf mathit mathcal mathbb text quad qquad binom rightarrow leftarrow Rightarrow
Leftarrow leftrightarrow Leftrightarrow mapsto div circ bullet star ast oplus otimes wedge vee neg
ll gg perp parallel angle triangle oint iint iiint bigcup bigcap emptyset aleph hbar ell Re Im
operatorname
""".split())


@dataclass(frozen=True)
class LatexNames:
    """Ids of the backslash and the ASCII letters in a tokenizer that writes each as one token."""

    backslash: int
    letters: dict[int, str]  # id -> letter
    ids: dict[str, int]  # letter -> id
    commands: tuple[str, ...] = COMMANDS

    @classmethod
    def of(cls, tokenizer) -> "LatexNames | None":
        """None where the backslash or a letter is not one token (a BPE tokenizer)."""
        ids = {}
        for char in "\\" + "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ":
            encoded = tokenizer.encode(char, add_special_tokens=False)
            if len(encoded) != 1 or encoded[0] == tokenizer.unk_token_id:
                return None
            ids[char] = encoded[0]
        backslash = ids.pop("\\")
        return cls(backslash, {token: char for char, token in ids.items()}, ids)

    def completions(self, prefix: str) -> list[str]:
        return [command for command in self.commands if command.startswith(prefix)]


@dataclass
class CommandShape:
    """Where the tokens so far stand in a command name, fed one token at a time."""

    names: LatexNames
    backslashes: int = 0  # length of the run of backslashes just written
    name: str | None = None  # letters of the command being written ("" right after its backslash)

    def copy(self) -> "CommandShape":
        return replace(self)

    def feed(self, token: int) -> None:
        if token == self.names.backslash:
            self.backslashes += 1
            self.name = "" if self.backslashes % 2 else None  # `\\` is a line break, not a command
            return
        self.backslashes = 0
        letter = self.names.letters.get(token)
        self.name = self.name + letter if self.name is not None and letter is not None else None

    def repair(self, drafts: list[int]) -> list[int]:
        """Drafts after the tokens fed so far, each run of letters in a command name made a
        known command where it spells none; at most as many drafts as given."""
        shape, names = self.copy(), self.names
        out: list[int] = []

        def emit(token: int) -> None:
            out.append(token)
            shape.feed(token)

        i = 0
        while i < len(drafts):
            if shape.name is None:
                emit(drafts[i])
                i += 1
                continue
            end = i
            while end < len(drafts) and drafts[end] in names.letters:
                end += 1
            run = "".join(names.letters[token] for token in drafts[i:end])
            rest = self._rest_of_name(shape.name, run, reaches_end=end == len(drafts))
            if rest is None:
                end = max(end, i + 1)  # a name kept as drafted; a token after it ends it
                for j in range(i, end):
                    emit(drafts[j])
            else:  # the name completed here; the draft after the run comes next
                # (past the run too: tried, keeping the drafter's tokens there drafts worse)
                for letter in rest:
                    emit(names.ids[letter])
            i = end
        return out[:len(drafts)]

    def _rest_of_name(self, written: str, run: str, reaches_end: bool) -> str | None:
        """The letters to draft after `written` instead of `run`, or None to keep `run`."""
        name = written + run
        if name in self.names.commands or (not run and not written):
            return None
        candidates = self.names.completions(written)
        if not candidates or (reaches_end and any(c.startswith(name) for c in candidates)):
            return None
        # Even a wrong first letter is mended (measured: trusting it, or keeping runs further
        # than half their letters from any command, drafts worse); a name not in the list is
        # then drafted wrong, as the drafter, trained on these names, mostly drafts it anyway.
        best = min(candidates, key=lambda command: Levenshtein.distance(command[len(written):], run))
        return best[len(written):]
