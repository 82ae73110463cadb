"""One labelled crop or page, as every corpus source yields it.

`source` names where the item came from (package, file inside the package, page, licence,
and how it was rendered), so any item in a shard or an evaluation set can be traced back
and every set can be checked for reserved or overlapping packages.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from PIL import Image


@dataclass(frozen=True)
class Source:
    package: str  # Debian package name
    file: str  # path inside the package, e.g. usr/share/doc/asymptote/asymptote.pdf
    licence: str  # the package's licence as its copyright file names it
    page: int | None = None  # 1-based page of a PDF, where there is one
    locator: str = ""  # where inside the file: a table's index, a formula's line, ...
    renderer: str = ""  # how the image was made: "pdfium@200dpi", "chromium", "pdflatex", "mathtext"

    def describe(self) -> str:
        """One line for a manifest: package:file[#page][@locator] (renderer)."""
        where = f"{self.package}:{self.file}"
        if self.page is not None:
            where += f"#p{self.page}"
        if self.locator:
            where += f"@{self.locator}"
        return f"{where} ({self.renderer})" if self.renderer else where


@dataclass
class CorpusItem:
    type: str  # text | table | formula | page
    image: Image.Image
    text: str  # the target: line text, page text, normalised table HTML, canonical LaTeX
    source: Source
    augment: str = ""  # the scan-like augmentation applied, "" for none
    extra: dict = field(default_factory=dict)

    @property
    def id(self) -> str:
        """Stable across builds: the same source, target and augmentation give the same id."""
        key = "\x1f".join([self.type, self.source.describe(), self.text, self.augment])
        return f"{self.type}-{self.source.package}-{hashlib.sha1(key.encode()).hexdigest()[:12]}"
