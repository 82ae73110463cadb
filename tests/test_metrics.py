"""OCR scores: edit similarity, TEDS, canonical LaTeX; edge cases and broken predictions."""

from __future__ import annotations

import pytest

from gravityocr.model.evaluation.scores import (
    canonicalize_latex, formula_similarity, page_similarity, parse_table, score, teds, text_similarity,
)

TABLE = "<table><tr><td>Name</td><td>Qty</td></tr><tr><td>apple</td><td>12</td></tr><tr><td>pear</td><td>7</td></tr></table>"


def test_text_similarity_edges():
    assert text_similarity("hello world", "hello world") == 1.0
    assert text_similarity("", "") == 1.0
    assert text_similarity("", "abc") == 0.0 and text_similarity("abc", "") == 0.0
    assert text_similarity("  hello \n\t world ", "hello world") == 1.0
    assert text_similarity("abcd", "abce") == pytest.approx(0.75)
    assert 0.0 <= text_similarity("xyz", "abcdef") < 1.0
    assert page_similarity("a  b\nc", "a b c") == 1.0


def test_teds_identical_and_one_wrong_cell():
    assert teds(TABLE, TABLE) == 1.0
    wrong = TABLE.replace("<td>12</td>", "<td>13</td>")
    value = teds(wrong, TABLE)
    assert 0.0 < value < 1.0
    # 9 nodes below the root (3 rows, 6 cells); the wrong cell costs its normalized edit distance 1/2.
    assert value == pytest.approx(1 - 0.5 / 9)
    assert teds(wrong, TABLE, structure_only=True) == 1.0


def test_teds_structure_differences():
    merged = "<table><tr><td colspan=\"2\">Name</td></tr><tr><td>apple</td><td>12</td></tr><tr><td>pear</td><td>7</td></tr></table>"
    assert 0.0 < teds(merged, TABLE) < 1.0
    assert teds(merged, TABLE, structure_only=True) < 1.0
    spans = parse_table('<table><tr><td rowspan="2" colspan=3>x</td></tr></table>').children[0].children[0]
    assert (spans.rowspan, spans.colspan) == (2, 3)


def test_teds_header_wrappers_are_the_canonical_form():
    wrapped = ("<table><thead><tr><th>Name</th><th>Qty</th></tr></thead><tbody><tr><td>apple</td><td>12</td></tr>"
               "<tr><td>pear</td><td>7</td></tr></tbody></table>")
    assert teds(wrapped, TABLE) == 1.0


@pytest.mark.parametrize("broken", [
    "", "not a table", "<table>", "<table><tr><td>Name<td>Qty</tr><tr><td>apple",
    "</td></tr><table><tr><td colspan='x'>Name</td></td></tr></table>", "<<<>>><table<tr>", "<table></table>",
])
def test_teds_malformed_prediction_does_not_raise(broken):
    value = teds(broken, TABLE)
    assert 0.0 <= value < 1.0


def test_teds_scores_what_parses_and_empty_prediction_scores_zero():
    assert teds("", TABLE) == 0.0 and teds("garbage", TABLE) == 0.0 and teds("<table></table>", TABLE) == 0.0
    unclosed = "<table><tr><td>Name<td>Qty<tr><td>apple<td>12<tr><td>pear<td>7"
    assert teds(unclosed, TABLE) == 1.0


@pytest.mark.parametrize("latex", [
    r"x^2+y_i", r"$$\frac12 + \left( a \right)^2$$", r"\alpha x + \beta", r"\sqrt [3] x", r"\text{if  x} y",
    r"x^\frac12", r"\frac{", r"}{x", "\\", r"\sum_{i=1}^n x_i \leq \int_0^1 f(t) dt", r"\left. x \right|",
])
def test_canonicalize_latex_is_idempotent(latex):
    once = canonicalize_latex(latex)
    assert canonicalize_latex(once) == once


def test_canonical_latex_forms():
    assert canonicalize_latex(r"x^2") == canonicalize_latex(r"x^{2}") == "x^{2}"
    assert canonicalize_latex(r"\frac 1 2") == canonicalize_latex(r"\dfrac{1}{2}") == r"\frac{1}{2}"
    assert canonicalize_latex(r"$\left( a+b \right)$") == "(a+b)"
    assert canonicalize_latex(r"\alpha   x") == r"\alpha x"  # the space keeps \alpha and x apart
    assert canonicalize_latex(r"a \le b") == r"a\leq b"
    assert canonicalize_latex(r"\sqrt[n]x") == r"\sqrt[n]{x}"


def test_formula_similarity():
    assert formula_similarity(r"x^2 + \frac12", r"x^{2}+\frac{1}{2}") == 1.0
    assert formula_similarity("", "") == 1.0 and formula_similarity("", "x") == 0.0
    assert 0.0 < formula_similarity(r"x^{3}", r"x^{2}") < 1.0


def test_score_dispatches_by_type():
    assert score("text", "a b", "a  b") == 1.0
    assert score("page", "a", "a") == 1.0
    assert score("table", TABLE, TABLE) == 1.0
    assert score("formula", "x^2", "x^{2}") == 1.0
    with pytest.raises(ValueError, match="unknown content type"):
        score("figure", "", "")


def test_a_page_counts_a_table_by_its_cells_text_and_leaves_out_dot_leaders():
    from gravityocr.model.evaluation.scores import page_similarity, page_text

    markdown = ('Table 1: Options\n\n<table><tr><td>name</td><td colspan="2">a &lt;b&gt; &amp; c</td></tr></table>\n\n'
                'Contents . . . . . . . . 5\n<xsl:param name="x"/>')
    truth = 'Table 1: Options\nname\na <b> & c\nContents 5\n<xsl:param name="x"/>'
    assert page_text(markdown) == page_text(truth) == 'Table 1: Options name a <b> & c Contents 5 <xsl:param name="x"/>'
    assert page_similarity(markdown, truth) == 1.0
    assert page_similarity(markdown.replace("name</td>", "nome</td>"), truth) < 1.0
