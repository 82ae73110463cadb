"""Joint CTC/attention greedy decoding of text lines (strip models whose config has
`ctc_prefix_weight`).

The vision tower's CTC classifier reads a one-strip crop frame by frame (one frame per 8 px,
model/network/strip_vision.py); the decoder writes its text token by token. Each token the
decoder commits on such a line is

    argmax_c  logits(c | h) + weight · log ψ(h + c)

where h is the text committed so far and ψ(h + c) is the CTC prefix probability: the
probability, summed over every alignment of the classifier's frames, that the line's reading
starts with h + c (for the eos: that it is exactly h). This is the joint CTC/attention
decoding of speech recognition (Watanabe et al. 2017, "Hybrid CTC/Attention Architecture for
End-to-End Speech Recognition", and its CTC prefix score), kept greedy. The
CTC term needs no alignment of its own: it knows where on the line a prefix ends, which is
what the decoder loses on long lines that repeat a pattern; the decoder keeps what the
classifier cannot (its language, its corrections).

ψ depends only on the committed tokens and on the classifier's frames, so the joint choice
is a function of the text before it, computed the same way in the reference decoders and in
every engine pass that commits tokens: greedy decoding stays one function, and a verify pass
accepts a draft exactly when the joint choice at its position equals it.

Only the decoder's `CANDIDATES` best tokens (and the eos) compete at each position, as ESPnet
scores CTC prefixes of a pre-beam only: the CTC term reorders what the decoder finds likely,
it does not bring in what the decoder rules out.

Only one-strip text crops are scored: a taller crop's strips overlap and are read one by
one, so their frames are no single alignment of its text; tables and formulas are written
in markup the classifier does not read.
"""

from __future__ import annotations

import numpy as np
import torch

CANDIDATES = 8
SCORED_TASKS = ("text",)
LOG_FLOOR = -1000.0


def line_scorer(model, log_probs: torch.Tensor | None, task: str, eos_ids) -> "CTCPrefixScorer | None":
    """The scorer of a crop the model decodes jointly: a `task` in SCORED_TASKS, one strip
    (`log_probs`: its frames, as `encode_images` gives them; None for a taller crop) and a
    model whose config has a `ctc_prefix_weight`. None: the crop is decoded by plain argmax."""
    weight = model.ctc_prefix_weight
    if not weight or log_probs is None or task not in SCORED_TASKS or not eos_ids:
        return None
    return CTCPrefixScorer(log_probs.detach().to("cpu", torch.float64).numpy(), frozenset(eos_ids), weight)


def greedy_tokens(logits: torch.Tensor, scorer: "CTCPrefixScorer | None", text: list[int], first: int) -> list[int]:
    """The greedy token of each row of `logits` (count, vocab), row i predicting the token
    after `text[:first + i]`: the argmax, or the joint choice where the line is scored."""
    return logits.argmax(-1).tolist() if scorer is None else scorer.choose(logits, text, first)


class CTCPrefixScorer:
    """CTC prefix scores over one strip's frames, for one sequence.

    `log_probs`: (frames, vocab + 1) log-probabilities of the classifier over the decoder's
    tokens (index = token id) and blank (the last column); those under `LOG_FLOOR` are raised
    to it (a probability of e^-1000 is none, and the cumulative sums below stay finite).
    States of the prefixes scored so far are kept along the last text asked about, so a
    sequence pays for each committed token once; the results do not depend on what was
    asked before."""

    def __init__(self, log_probs: np.ndarray, eos_ids: frozenset[int], weight: float):
        self.log_probs = np.maximum(np.asarray(log_probs, dtype=np.float64), LOG_FLOOR)
        self.frames, classes = self.log_probs.shape
        self.blank = classes - 1
        self.eos_ids = sorted(eos_ids)
        self.weight = weight
        self._runs = np.cumsum(self.log_probs, axis=0)  # per class: log of the product of its frames so far
        # per prefix: (log r_n, log r_b) over the frames: the probability that frames 0..t
        # read the prefix, ending in a non-blank / a blank frame
        self._texts: list[int] = []
        self._states: list[tuple[np.ndarray, np.ndarray]] = [(np.full(self.frames, -np.inf),
                                                              self._runs[:, self.blank])]

    def choose(self, logits: torch.Tensor, text: list[int], first: int) -> list[int]:
        """The joint choice at each of `logits`' rows (count, vocab), row i predicting the
        token after `text[:first + i]`, up to the first row whose choice is not the text's
        next token: a verify pass accepts no draft past it. The rows after it keep their
        argmax, which no caller reads."""
        values = logits.detach().to("cpu", torch.float64).numpy()
        picks = values.argmax(-1).tolist()
        self._advance(text[:first])
        for i, row in enumerate(values):
            k = first + i
            if i:
                self._hold(k, text[k - 1])
            candidates = [int(c) for c in np.argsort(-row, kind="stable")[:CANDIDATES] if c not in self.eos_ids]
            tokens = candidates + self.eos_ids
            joint = row[tokens] + self.weight * self._prefix_scores(k, tokens)
            picks[i] = tokens[int(np.argmax(joint))]
            if k >= len(text) or picks[i] != text[k]:
                break
        return picks

    def prefix_scores(self, prefix: list[int], tokens: list[int]) -> np.ndarray:
        """log ψ(prefix + c) for each token c (an eos: log p(prefix))."""
        self._advance(prefix)
        return self._prefix_scores(len(prefix), tokens)

    def _prefix_scores(self, k: int, tokens: list[int]) -> np.ndarray:
        """log ψ(prefix + c) for each token c (an eos: log p(prefix)), the prefix being the
        first k tokens of the text the states are kept along."""
        r_n, r_b = self._states[k]
        either = np.logaddexp(r_n, r_b)
        start = 0.0 if k == 0 else -np.inf  # only the empty prefix is read before frame 0
        entering = np.concatenate(([start], either[:-1]))
        scores = np.logaddexp.reduce(entering[:, None] + self.log_probs[:, tokens], axis=0)
        last = self._texts[k - 1] if k else None
        for j, c in enumerate(tokens):
            if c in self.eos_ids:
                scores[j] = either[-1]
            elif c == last:  # a repeat needs a blank between the two
                scores[j] = np.logaddexp.reduce(np.concatenate(([start], r_b[:-1])) + self.log_probs[:, c])
        return scores

    def _advance(self, text: list[int]) -> None:
        """Keep the states along `text`: those of the prefixes it shares with the last text
        stay, the rest are computed."""
        shared = 0
        limit = min(len(text), len(self._texts))
        while shared < limit and text[shared] == self._texts[shared]:
            shared += 1
        del self._texts[shared:], self._states[shared + 1:]
        for c in text[shared:]:
            self._append(c)

    def _hold(self, k: int, token: int) -> None:
        """Make the kept text's k-th token `token`, its first k - 1 being already right."""
        if len(self._texts) >= k and self._texts[k - 1] == token:
            return
        del self._texts[k - 1:], self._states[k:]
        self._append(token)

    def _append(self, c: int) -> None:
        self._states.append(self._extend(self._states[-1], c, empty=not self._texts))
        self._texts.append(c)

    def _extend(self, state, c: int, empty: bool) -> tuple[np.ndarray, np.ndarray]:
        """The state of prefix + c from the prefix's. The recursions
            r_n'(t) = (r_n'(t-1) + before(t-1)) · y_c(t),   r_b'(t) = (r_n'(t-1) + r_b'(t-1)) · y_blank(t)
        are first-order linear, so each is a cumulative log-sum-exp after dividing out the
        running product of its factor."""
        r_n, r_b = state
        last = self._texts[-1] if self._texts else None
        before = r_b if c == last else np.logaddexp(r_n, r_b)
        run_c, run_blank = self._runs[:, c], self._runs[:, self.blank]
        start = 0.0 if empty else -np.inf
        new_n = np.logaddexp.accumulate(np.concatenate(([start], before[:-1] - run_c[:-1]))) + run_c
        new_b = np.logaddexp.accumulate(np.concatenate(([-np.inf], new_n[:-1] - run_blank[:-1]))) + run_blank
        return new_n, new_b
