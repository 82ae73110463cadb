"""Which Debian packages feed training and which feed our evaluation set, per content type.

The two sides are disjoint (a package on one side never appears on the other, for any
type), and neither holds a package reserved for independent evaluation; `check_sources`
proves both and runs whenever a build starts.
"""

from __future__ import annotations

from gravityocr.corpus.debian import check_not_reserved

# type -> packages read for training shards
TRAINING = {
    "text": ["texlive-pictures-doc", "texlive-pstricks-doc", "texlive-fonts-extra-doc", "lilypond-doc-pdf",
             "live-manual-pdf", "siscone-doc-pdf"],
    "page": ["texlive-pictures-doc", "texlive-pstricks-doc", "texlive-fonts-extra-doc", "lilypond-doc-pdf",
             "live-manual-pdf", "siscone-doc-pdf"],
    "table": ["postgresql-doc-15", "gimp-help-en", "texlive-pictures-doc", "texlive-pstricks-doc",
              "texlive-fonts-extra-doc"],
    "formula": ["texlive-pictures-doc", "texlive-pstricks-doc", "texlive-fonts-extra-doc", "texlive-latex-extra-doc"],
}

# type -> packages read for the committed evaluation set data/real
EVALUATION = {
    "text": ["asymptote-doc", "why3-doc-pdf", "gri-pdf-doc", "bash-doc", "docbook-xsl-doc-pdf",
             "auto-multiple-choice-doc-pdf"],
    "page": ["asymptote-doc", "why3-doc-pdf", "gri-pdf-doc", "bash-doc", "docbook-xsl-doc-pdf",
             "auto-multiple-choice-doc-pdf"],
    "table": ["sqlite3-doc", "git-doc", "maxima-doc"],
    "formula": ["texlive-lang-english", "texlive-lang-french"],
}


def check_sources() -> None:
    """ValueError unless training and evaluation packages are disjoint and none is reserved."""
    training = {p for packages in TRAINING.values() for p in packages}
    evaluation = {p for packages in EVALUATION.values() for p in packages}
    for package in training | evaluation:
        check_not_reserved(package)
    shared = training & evaluation
    if shared:
        raise ValueError(f"packages on both the training and the evaluation side: {sorted(shared)}")
