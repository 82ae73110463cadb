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
    "formula": ["texlive-pictures-doc", "texlive-pstricks-doc", "texlive-fonts-extra-doc", "texlive-latex-extra-doc",
                "texlive-lang-european", "texlive-lang-italian", "texlive-lang-polish", "texlive-lang-cyrillic", "texlive-lang-czechslovak", "texlive-lang-greek",
                "texlive-lang-other", "texlive-plain-generic", "texlive-luatex", "texlive-xetex", "texlive-music",
                "texlive-bibtex-extra", "texlive-formats-extra"],
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

# type -> packages read for the development set data/dev: where settings are chosen, so that
# data/real stays a measurement
DEVELOPMENT = {
    "text": ["texlive-lang-german", "pari-doc", "debian-refcard"],
    "formula": ["texlive-lang-german", "pari-doc", "texlive-lang-portuguese", "texlive-lang-spanish"],
}


def check_sources() -> None:
    """ValueError unless the training, evaluation and development packages are pairwise
    disjoint and none is reserved."""
    sides = {"training": TRAINING, "evaluation": EVALUATION, "development": DEVELOPMENT}
    packages = {side: {p for names in types.values() for p in names} for side, types in sides.items()}
    for names in packages.values():
        for package in names:
            check_not_reserved(package)
    for first, second in (("training", "evaluation"), ("training", "development"), ("evaluation", "development")):
        shared = packages[first] & packages[second]
        if shared:
            raise ValueError(f"packages on both the {first} and the {second} side: {sorted(shared)}")
