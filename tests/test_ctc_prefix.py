"""The CTC prefix scores of joint decoding (model/decode/ctc_prefix.py) against their
definition: sums over every frame alignment, enumerated."""

import itertools

import numpy as np
import pytest
import torch

from gravityocr.model.decode.ctc_prefix import CANDIDATES, CTCPrefixScorer, greedy_tokens

FRAMES, TOKENS = 6, 4  # tokens 0..3 (3 is the eos), blank = 4
EOS = 3


def _collapse(path: tuple[int, ...]) -> list[int]:
    out, previous = [], None
    for label in path:
        if label != TOKENS and label != previous:
            out.append(label)
        previous = label
    return out


def _enumerated(log_probs: np.ndarray, prefix: list[int], token: int) -> float:
    """log of the probability, over all alignments, that the reading starts with prefix + token
    (for the eos: that it is exactly prefix)."""
    total = 0.0
    for path in itertools.product(range(TOKENS + 1), repeat=FRAMES):
        read = _collapse(path)
        match = read == prefix if token == EOS else read[:len(prefix) + 1] == prefix + [token]
        if match:
            total += np.exp(sum(log_probs[t, label] for t, label in enumerate(path)))
    return float(np.log(total))


@pytest.fixture(scope="module")
def log_probs() -> np.ndarray:
    return np.log(np.random.default_rng(0).dirichlet(np.ones(TOKENS + 1), size=FRAMES))


@pytest.mark.parametrize("prefix", [[], [0], [0, 0], [1, 0], [2, 1, 0], [0, 1, 0, 1]])
def test_prefix_scores_are_the_sum_over_every_alignment(log_probs, prefix):
    scorer = CTCPrefixScorer(log_probs, frozenset([EOS]), weight=1.0)
    tokens = [0, 1, 2, EOS]
    expected = [_enumerated(log_probs, prefix, token) for token in tokens]
    np.testing.assert_allclose(scorer.prefix_scores(prefix, tokens), expected, rtol=1e-10)


def test_scores_do_not_depend_on_what_was_asked_before(log_probs):
    """The states kept along the last text asked about are a cache, not an input."""
    fresh = CTCPrefixScorer(log_probs, frozenset([EOS]), weight=1.0)
    used = CTCPrefixScorer(log_probs, frozenset([EOS]), weight=1.0)
    used.prefix_scores([2, 2, 1, 0], [0, 1])
    used.prefix_scores([2, 0], [0, 1])
    used.choose(torch.zeros(3, TOKENS + 1), [2, 1, 1, 0], 1)
    assert used.prefix_scores([2, 1, 0], [0, 1, 2, EOS]).tolist() == \
        fresh.prefix_scores([2, 1, 0], [0, 1, 2, EOS]).tolist()


def test_the_joint_choice_adds_the_weighted_score_to_the_decoder_candidates(log_probs):
    """Each row's choice is the best of its `CANDIDATES` highest logits and the eos by logit
    plus weight times the prefix score, up to the first row whose choice is not the text's
    next token (a verify pass accepts nothing past it); with weight 0 it is the argmax."""
    rng = np.random.default_rng(1)
    logits = torch.tensor(rng.normal(size=(4, 12)))  # a vocabulary wider than the classifier's
    wide = np.full((FRAMES, 13), -50.0)  # tokens 4..11 never read, blank last
    wide[:, :TOKENS] = log_probs[:, :TOKENS]
    wide[:, -1] = log_probs[:, TOKENS]
    for weight in (0.0, 1.5):
        scorer = CTCPrefixScorer(wide, frozenset([EOS]), weight)
        expected, text = [], [2]
        for row in logits.numpy():  # the text follows the joint choices
            candidates = [int(c) for c in np.argsort(-row, kind="stable")[:CANDIDATES] if c != EOS] + [EOS]
            scores = CTCPrefixScorer(wide, frozenset([EOS]), weight).prefix_scores(text, candidates)
            expected.append(candidates[int(np.argmax([row[c] + weight * s for c, s in zip(candidates, scores)]))])
            text = text + [expected[-1]]
        text[-1] = (expected[-1] + 1) % TOKENS  # but for its last token
        assert scorer.choose(logits, text, 1) == expected
        if weight == 0.0:
            assert expected == logits.argmax(-1).tolist()
        # a text that differs at the first row: the rows after it are not chosen
        assert scorer.choose(logits, [2, (expected[0] + 1) % TOKENS], 1)[0] == expected[0]
    assert greedy_tokens(logits, None, [2], 1) == logits.argmax(-1).tolist()


def test_a_token_the_classifier_never_reads_leaves_the_scores_finite():
    """Zero probabilities (log -inf) are floored: the scores stay finite and still match the
    sum over alignments, in which such a frame counts for nothing."""
    log_probs = np.log(np.random.default_rng(2).dirichlet(np.ones(TOKENS + 1), size=FRAMES))
    log_probs[:, 2] = -np.inf
    log_probs[3, 0] = -np.inf
    log_probs -= np.logaddexp.reduce(log_probs, axis=1, keepdims=True)  # each frame's probabilities sum to 1
    scorer = CTCPrefixScorer(log_probs, frozenset([EOS]), weight=1.0)
    for prefix in ([], [0], [1, 0]):
        scores = scorer.prefix_scores(prefix, [0, 1, EOS])
        assert np.isfinite(scores).all()
        np.testing.assert_allclose(scores, [_enumerated(log_probs, prefix, token) for token in (0, 1, EOS)],
                                   rtol=1e-10)
        assert scorer.prefix_scores(prefix, [2])[0] < -900
