"""Formulas found in LaTeX sources, with the targets they are scored against.

Extraction (`find_display_formulas`, `extract_display_math`) is pure string work: it finds
`\\[...\\]`, `$$...$$`, `equation(*)`, `displaymath`, and the single equations of `align(*)`
and `gather(*)` (rows split at `\\\\`, side-by-side equations at every second `&`), drops
`\\label`, `\\tag`, `\\nonumber` and alignment `&`; with `FormulaConfig.inline` (training
builds) inline `$...$` and `\\(...\\)` math too, set in text style. It keeps a formula only when

- every command in it is a standard LaTeX / amsmath / amssymb math command (`MATH_COMMANDS`),
  every environment a standard math one (`MATH_ENVIRONMENTS`), and none of its commands or
  environments is (re)defined by the document itself: its look then does not depend on the
  document's preamble, so our own preamble renders what the document showed;
- it and its target are at most `FormulaConfig.max_chars` long (the target at least
  `min_chars`) and use only characters of the recogniser's vocabulary, so the target can be
  decoded at all;
- its target, `canonicalize_latex(formula)`, is a fixed point of `canonicalize_latex`: the
  evaluator scores canonical forms, and a target it would rewrite again could never be
  matched exactly.

`FormulaConfig` also holds the settings rendering uses.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator
from dataclasses import dataclass

from gravityocr.model.evaluation.scores import canonicalize_latex
from gravityocr.model.network.tokenizer import character_vocabulary


# Commands of LaTeX's math mode, amsmath and amssymb that render the same in any document
# loading amsmath and amssymb (without their backslash).
MATH_COMMANDS = frozenset("""
alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa varkappa lambda mu nu
xi pi varpi rho varrho sigma varsigma tau upsilon phi varphi chi psi omega digamma
Gamma Delta Theta Lambda Xi Pi Sigma Upsilon Phi Psi Omega
varGamma varDelta varTheta varLambda varXi varPi varSigma varUpsilon varPhi varPsi varOmega
pm mp times div cdot ast star circ bullet oplus ominus otimes oslash odot cap cup sqcap sqcup vee
wedge land lor setminus smallsetminus wr diamond bigtriangleup bigtriangledown triangleleft
triangleright amalg dagger ddagger uplus boxplus boxminus boxtimes boxdot ltimes rtimes dotplus
centerdot barwedge curlyvee curlywedge intercal
leq le geq ge neq ne equiv sim simeq approx cong propto prec succ preceq succeq ll gg subset supset
subseteq supseteq subsetneq supsetneq nsubseteq nsupseteq sqsubset sqsupset sqsubseteq sqsupseteq
in ni notin owns vdash dashv models perp mid parallel nmid nparallel asymp doteq bowtie smile frown
leqslant geqslant lesssim gtrsim lll ggg approxeq thicksim thickapprox backsim eqsim triangleq
nless ngtr nleq ngeq nleqslant ngeqslant nsim ncong lneq gneq vDash Vdash nvdash nvDash
leftarrow gets rightarrow to Leftarrow Rightarrow leftrightarrow Leftrightarrow longleftarrow
longrightarrow Longleftarrow Longrightarrow longleftrightarrow Longleftrightarrow iff implies
impliedby mapsto longmapsto hookleftarrow hookrightarrow uparrow downarrow updownarrow Uparrow
Downarrow Updownarrow nearrow searrow swarrow nwarrow leftharpoonup leftharpoondown rightharpoonup
rightharpoondown rightleftharpoons leftrightharpoons xrightarrow xleftarrow twoheadrightarrow
twoheadleftarrow rightarrowtail leftarrowtail leftrightarrows rightleftarrows rightrightarrows
leftleftarrows upharpoonright upharpoonleft downharpoonright downharpoonleft circlearrowleft
circlearrowright curvearrowleft curvearrowright nleftarrow nrightarrow nLeftarrow nRightarrow
nleftrightarrow nLeftrightarrow rightsquigarrow leftrightsquigarrow
infty partial nabla forall exists nexists emptyset varnothing neg lnot aleph beth gimel hbar hslash
ell wp Re Im prime backprime angle measuredangle sphericalangle triangle square blacksquare
top bot surd flat natural sharp clubsuit diamondsuit heartsuit spadesuit imath jmath
ldots cdots vdots ddots dots dotsc dotsb dotsm dotsi dotso colon complement mho eth Bbbk circledS
checkmark lozenge blacklozenge bigstar blacktriangle blacktriangledown vartriangle
sum prod coprod int iint iiint iiiint idotsint oint bigcup bigcap bigsqcup bigvee bigwedge bigoplus
bigotimes bigodot biguplus
arccos arcsin arctan arg cos cosh cot coth csc deg det dim exp gcd hom inf ker lg lim liminf limsup
ln log max min Pr sec sin sinh sup tan tanh injlim projlim varliminf varlimsup varinjlim varprojlim
langle rangle lceil rceil lfloor rfloor lvert rvert lVert rVert vert Vert backslash lbrace rbrace
lbrack rbrack ulcorner urcorner llcorner lrcorner lgroup rgroup lmoustache rmoustache
left right middle big Big bigg Bigg bigl bigr Bigl Bigr biggl biggr Biggl Biggr bigm Bigm
hat check breve acute grave tilde bar vec dot ddot dddot ddddot mathring widehat widetilde overline
underline overbrace underbrace overrightarrow overleftarrow overleftrightarrow underrightarrow
underleftarrow underleftrightarrow
mathrm mathbf mathit mathsf mathtt mathcal mathbb mathfrak mathnormal boldsymbol pmb
frac dfrac tfrac cfrac genfrac binom dbinom tbinom sqrt stackrel overset underset substack
text textrm textbf textit texttt textsf textup mbox operatorname mod bmod pmod pod
quad qquad enspace thinspace medspace thickspace negthinspace negmedspace negthickspace
phantom hphantom vphantom smash strut mathop mathbin mathrel
displaystyle textstyle scriptstyle scriptscriptstyle limits nolimits not
begin end hline
""".split())

# Control symbols (a backslash and one non-letter) with a fixed meaning in math mode.
MATH_SYMBOLS = frozenset(",;:!> {}|#%&_$\\")

# Environments a display formula may contain.
MATH_ENVIRONMENTS = frozenset("""
matrix pmatrix bmatrix Bmatrix vmatrix Vmatrix smallmatrix cases array aligned alignedat gathered
split subarray
""".split())

# Display environments and how a body is split into formulas (True: one per line).
DISPLAY_ENVIRONMENTS = {"equation": False, "equation*": False, "displaymath": False,
                        "align": True, "align*": True, "gather": True, "gather*": True}

_VOCABULARY = frozenset(character_vocabulary()) - {"\n"}

_COMMENT = re.compile(r"(?m)((?:^|[^\\])(?:\\\\)*)%.*$")
# Tokens of a LaTeX source as far as finding math needs them.
_SOURCE_TOKEN = re.compile(r"\\verb\*?([^a-zA-Z\s*])[^\n]*?\1|\\(?:begin|end)\s*\{[^{}\n]*\}"
                           r"|\\[a-zA-Z@]+|\\.|\$\$|\$|\n[ \t]*\n|[{}&]", re.DOTALL)
_DEFINITION = re.compile(
    r"\\(?:(?:re)?newcommand|providecommand|DeclareRobustCommand|DeclareMathOperator|"
    r"(?:New|Renew|Provide|Declare)DocumentCommand|DeclareMathSymbol|DeclarePairedDelimiter\w*|"
    r"DeclareMathAlphabet|let|[egx]?def|(?:re)?newenvironment|(?:New|Renew)DocumentEnvironment)"
    r"\*?\s*\{?\s*\\?([a-zA-Z@]+\*?)")
_COMMAND = re.compile(r"\\([a-zA-Z]+)|\\(.)", re.DOTALL)
_ENVIRONMENT = re.compile(r"\\(begin|end)\s*\{([^{}]*)\}")
_DROPPED = re.compile(r"\\label\s*\{[^{}]*\}|\\tag\*?\s*\{[^{}]*\}|\\nonumber\b|\\notag\b")
_ROW_OPTIONS = re.compile(r"\s*\*?\s*(?:\[[^\[\]]*\])?")


@dataclass(frozen=True)
class FormulaConfig:
    max_chars: int = 150  # longest formula (as rendered and as target) kept
    min_chars: int = 3  # shortest target kept: a lone symbol says little about formula layout
    dpi: tuple[int, int] = (100, 300)  # inclusive range the rasterising dpi is drawn from
    mathtext_points: tuple[int, int] = (10, 14)  # inclusive range of mathtext font sizes, in points
    latex_points: int = 10  # the article class's font size; the drawn dpi varies the pixel size
    margin_points: float = 3.0  # white margin around the ink, in points at the item's dpi
    batch: int = 64  # formulas per pdflatex run
    latex_timeout_s: float = 300.0
    inline: bool = False  # inline math too, set in text style (training builds)
    math_styles: tuple[str, ...] = ("cm",)  # pdflatex math font styles drawn from (MATH_STYLES)


@dataclass(frozen=True)
class DisplayFormula:
    line: int  # 1-based line of the source where the formula starts
    latex: str  # the formula as rendered: labels, tags and alignment & removed, whitespace folded
    target: str  # canonicalize_latex(latex), a fixed point of canonicalize_latex
    display: bool = True  # False: inline math, set in text style


def extract_display_math(tex_source: str, config: FormulaConfig = FormulaConfig()) -> list[str]:
    """The usable display formulas of one LaTeX source, in source order, one per target."""
    return [formula.latex for formula in find_display_formulas(tex_source, config)]


def find_display_formulas(tex_source: str, config: FormulaConfig = FormulaConfig()) -> list[DisplayFormula]:
    """Every display formula (or align/gather line) of the source that passes the filters in the
    module docstring, first occurrence of each target only; with `config.inline`, then every
    inline formula whose target no display formula of the source has."""
    text = _COMMENT.sub(r"\1", tex_source)
    defined = {name for name in _DEFINITION.findall(text)}
    line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
    found: list[DisplayFormula] = []
    seen: set[str] = set()
    bodies = list(_display_bodies(text, config.inline))
    for wanted in (True, False):  # display formulas first: an inline repeat of one is not kept
        for offset, body, split, display in bodies:
            if display != wanted:
                continue
            for piece_offset, piece in (_equations(body) if split else [(0, body)]):
                latex = " ".join(_DROPPED.sub(" ", piece).split())
                if not display and not _reads_as_math(latex):
                    continue
                target = usable_target(latex, defined, config)
                if target is None or target in seen:
                    continue
                seen.add(target)
                start = offset + piece_offset + (len(piece) - len(piece.lstrip()))
                found.append(DisplayFormula(bisect.bisect_right(line_starts, start), latex, target, display))
    return found


def usable_target(latex: str, defined: set[str] = frozenset(),
                  config: FormulaConfig = FormulaConfig()) -> str | None:
    """The formula's target if it passes the filters in the module docstring, else None."""
    if not latex or len(latex) > config.max_chars or not set(latex) <= _VOCABULARY:
        return None
    if re.search(r"(?<!\\)(?:\\\\)*[$#]", latex) or not _balanced(latex):
        return None
    for word, symbol in _COMMAND.findall(latex):
        if word and (word not in MATH_COMMANDS or word in defined):
            return None
        if symbol and symbol not in MATH_SYMBOLS:
            return None
    for _, name in _ENVIRONMENT.findall(latex):
        if name not in MATH_ENVIRONMENTS or name in defined:
            return None
    target = canonicalize_latex(latex)
    if not config.min_chars <= len(target) <= config.max_chars or canonicalize_latex(target) != target:
        return None
    return target


_TEXT_ARGUMENT = re.compile(r"\\(?:text\w*|math\w+|operatorname|mbox)\s*\{[^{}]*\}")
_WORD = re.compile(r"[A-Za-z]{4,}|[A-Za-z]\.[A-Za-z]|://")


def _reads_as_math(latex: str) -> bool:
    """False for what sits between dollars in a source without being math: a word of four or
    more letters outside a command name and text-like argument (shell variables, prose), a
    dotted name (TikZ's `(node.north)`) or an address."""
    return _WORD.search(_COMMAND.sub(" ", _TEXT_ARGUMENT.sub(" ", latex))) is None


def _display_bodies(text: str, inline: bool = False) -> Iterator[tuple[int, str, bool, bool]]:
    """(offset, body, split into lines?, display?) of each display in the source, and with
    `inline` of each inline `$...$` and `\\(...\\)` too. An inline `$...$` is always matched, so that
    its dollars are never taken for `$$`; nothing spans a blank line (TeX refuses a paragraph
    break in math), which resynchronises the scan after any unbalanced `$`."""
    tokens = list(_SOURCE_TOKEN.finditer(text))
    i = 0
    while i < len(tokens):
        token = re.sub(r"\s+", "", tokens[i].group())
        closer, split = None, False
        if token == r"\[":
            closer = r"\]"
        elif token == r"\(":
            closer = r"\)"
        elif token in ("$$", "$"):
            closer = token
        elif token.startswith(r"\begin{") and token[7:-1] in DISPLAY_ENVIRONMENTS:
            closer, split = r"\end{" + token[7:-1] + "}", DISPLAY_ENVIRONMENTS[token[7:-1]]
        if closer is None:
            i += 1
            continue
        j = i + 1
        while j < len(tokens):
            other = re.sub(r"\s+", "", tokens[j].group())
            if other == closer or not other or (closer not in ("$", r"\)") and other in (r"\[", "$$")):
                break
            j += 1
        if j < len(tokens) and re.sub(r"\s+", "", tokens[j].group()) == closer:
            display = token not in ("$", r"\(")
            if display or inline:
                yield tokens[i].end(), text[tokens[i].end():tokens[j].start()], split, display
            i = j + 1
        else:
            i += 1


def _equations(body: str) -> list[tuple[int, str]]:
    """(offset, text) of the equations of an align/gather body. Rows end at `\\\\` (its `*` and
    `[length]` option dropped, as amsmath reads them); within a row, odd `&` are alignment points
    (dropped) and even `&` separate side-by-side equations (split), all outside braces and nested
    environments."""
    equations = []
    for row_offset, row in _split_top_level(body, "\\\\"):
        cells = _split_top_level(row, "&")
        for k in range(0, len(cells), 2):
            equations.append((row_offset + cells[k][0], " ".join(cell for _, cell in cells[k:k + 2])))
    return equations


def _split_top_level(text: str, separator: str) -> list[tuple[int, str]]:
    """(offset, piece) of `text` split at `separator` tokens outside braces and environments."""
    pieces, depth, start = [], 0, 0
    for m in _SOURCE_TOKEN.finditer(text):
        token = m.group()
        if token == "{" or token.startswith(r"\begin"):
            depth += 1
        elif token == "}" or token.startswith(r"\end"):
            depth -= 1
        elif token == separator and depth == 0:
            pieces.append((start, text[start:m.start()]))
            start = _ROW_OPTIONS.match(text, m.end()).end() if separator == "\\\\" else m.end()
    pieces.append((start, text[start:]))
    return pieces


def _balanced(latex: str) -> bool:
    """Braces balanced and environments opened and closed in order."""
    depth = 0
    for m in re.finditer(r"\\.|[{}]", latex, re.DOTALL):
        if m.group() == "{":
            depth += 1
        elif m.group() == "}":
            depth -= 1
            if depth < 0:
                return False
    if depth:
        return False
    stack = []
    for kind, name in _ENVIRONMENT.findall(latex):
        if kind == "begin":
            stack.append(name)
        elif not stack or stack.pop() != name:
            return False
    return not stack
