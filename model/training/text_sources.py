"""Text for synthetic crops: prose and code lines found on this machine and generated numbers,
dates and prices, cleaned onto a stage's character set and cut into lines and paragraphs.

Text comes from material installed on any Debian image (licence and copyright files for
prose, Python sources of installed packages for code) plus generated numbers, dates and
prices. The R, gnuplot and Octave manuals and Python's documentation are reserved for
independent evaluation and are never read here.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import random
import re
import textwrap
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from gravityocr.model.training.curriculum import CurriculumStage

_RESERVED_PACKAGES = re.compile(r"^(r-|gnuplot|octave|python[0-9.]*-doc)")
_CODE_PACKAGES = ("numpy", "matplotlib", "PIL", "rapidfuzz", "apted", "yaml", "tqdm", "safetensors")
_FALLBACK_PROSE = [
    "The quick brown fox jumps over the lazy dog.",
    "Permission is hereby granted, free of charge, to any person obtaining a copy of this software.",
    "This program is distributed in the hope that it will be useful, but without any warranty.",
    "Redistribution and use in source and binary forms, with or without modification, are permitted.",
    "All rights reserved. Copyright notices must be retained in all copies of the work.",
    "The results were recorded on 12 March 2021 and checked twice by the team.",
    "Please read the following terms carefully before using the service.",
    "A short summary of the changes is given in the table below.",
]
_FALLBACK_CODE = [
    "def main(argv=None):",
    "    return sum(x * x for x in values)",
    "if __name__ == \"__main__\":",
    "result = {key: value for key, value in items.items()}",
    "for i in range(len(data) - 1):",
    "raise ValueError(f\"unknown option {name!r}\")",
]
_TYPOGRAPHIC = str.maketrans({"‘": "'", "’": "'", "“": '"', "”": '"', "–": "-", "—": "-", "…": "...",
                              "\t": " ", "•": "*", "·": ".", "×": "x", "÷": "/"})


@dataclass(frozen=True)
class Corpus:
    prose: tuple[str, ...]
    code: tuple[str, ...]


def _read_lines(path: Path, limit_bytes: int) -> list[str]:
    try:
        raw = path.read_bytes()[:limit_bytes].decode("utf-8", errors="ignore")
    except OSError:
        return []
    return [" ".join(line.split()) for line in raw.splitlines()]


CORPUS_FILE_VARIABLE = "GRAVITYOCR_CORPUS"


def write_corpus(path: str | Path) -> None:
    """Save this machine's corpus, so another machine (a leased GPU) renders the same text."""
    found = corpus()
    Path(path).write_text(json.dumps({"prose": found.prose, "code": found.code}))


@functools.cache
def corpus() -> Corpus:
    """Prose and code lines found on this machine, read once; a built-in list where none are.
    A file written by `write_corpus`, named in $GRAVITYOCR_CORPUS, replaces them."""
    if os.environ.get(CORPUS_FILE_VARIABLE):
        saved = json.loads(Path(os.environ[CORPUS_FILE_VARIABLE]).read_text())
        return Corpus(tuple(saved["prose"]), tuple(saved["code"]))
    prose: dict[str, None] = {}
    paths = sorted(Path("/usr/share/common-licenses").glob("*")) + sorted(Path("/usr/share/doc").glob("*/copyright"))
    for path in paths:
        if path.parent.name != "common-licenses" and _RESERVED_PACKAGES.match(path.parent.name):
            continue
        for line in _read_lines(path, 32_000):
            if 12 <= len(line) <= 200 and sum(c.isalpha() for c in line) > len(line) // 2:
                prose.setdefault(line)
    code: dict[str, None] = {}
    for package in _CODE_PACKAGES:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            continue
        root = Path(list(spec.submodule_search_locations)[0])
        for path in sorted(root.rglob("*.py"))[:40]:
            for line in _read_lines(path, 16_000):
                if 8 <= len(line) <= 120 and not line.startswith(('"""', "'''")):
                    code.setdefault(line)
    return Corpus(tuple(prose) or tuple(_FALLBACK_PROSE), tuple(code) or tuple(_FALLBACK_CODE))


def clean_text(text: str, allowed: frozenset[str]) -> str:
    """Map text onto `allowed`: typographic forms to ASCII, accents stripped, the rest dropped."""
    out = []
    for char in text:
        if char in allowed:
            out.append(char)
            continue
        char = char.translate(_TYPOGRAPHIC)
        if all(c in allowed for c in char):
            out.append(char)
            continue
        base = "".join(c for c in unicodedata.normalize("NFKD", char) if c in allowed)
        out.append(base)
    return " ".join("".join(out).split())


_MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
           "October", "November", "December"]


def number_phrase(rng: random.Random) -> str:
    """A number as documents print them: amounts, prices, dates, times, percentages, versions."""
    form = rng.randrange(10)
    if form == 0:
        return str(rng.randint(0, 9999))
    if form == 1:
        return f"{rng.randint(1000, 9_999_999):,}"
    if form == 2:
        return f"{rng.choice('$€£¥')}{rng.randint(0, 9999)}.{rng.randint(0, 99):02d}"
    if form == 3:
        return f"{rng.uniform(-100, 100):.{rng.randint(1, 3)}f}"
    if form == 4:
        return f"{rng.randint(0, 100)}.{rng.randint(0, 9)}%"
    if form == 5:
        return f"{rng.randint(1990, 2030)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    if form == 6:
        return f"{rng.randint(1, 28)} {rng.choice(_MONTHS)} {rng.randint(1900, 2030)}"
    if form == 7:
        return f"{rng.randint(1, 28):02d}/{rng.randint(1, 12):02d}/{rng.randint(1990, 2030)}"
    if form == 8:
        return f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}"
    return f"v{rng.randint(0, 12)}.{rng.randint(0, 30)}.{rng.randint(0, 9)}"


_NUMBER_LABELS = ["Total", "Subtotal", "Amount", "Balance", "Date", "Due", "Invoice No.", "Page", "Ref.", "Tel.",
                  "Qty", "Price", "Rate", "Tax", "Net", "Order", "Account", "Version", "Time", "Year"]


def _number_field(rng: random.Random) -> str:
    """A labelled or bare number, as forms, invoices and reports print them."""
    form = rng.randrange(5)
    if form == 0:
        return f"{rng.choice(_NUMBER_LABELS)}: {number_phrase(rng)}"
    if form == 1:
        return f"{rng.choice(_NUMBER_LABELS)} {number_phrase(rng)}"
    if form == 2:
        return f"{rng.randint(1, 500)} of {rng.randint(500, 9999)}"
    if form == 3:
        return f"{number_phrase(rng)} - {number_phrase(rng)}"
    return number_phrase(rng)


def _passage(rng: random.Random, source: str, min_length: int) -> list[str]:
    """Consecutive lines of one source, at least `min_length` characters in all."""
    if source == "numbers":
        fields = [_number_field(rng)]
        while sum(len(f) + 2 for f in fields) < min_length:
            fields.append(_number_field(rng))
        return [rng.choice([" ", ", ", "; ", " | "]).join(fields)]
    lines = corpus().prose if source == "prose" else corpus().code
    start = rng.randrange(len(lines))
    out, total = [], 0
    while total < min_length and len(out) < len(lines):
        out.append(lines[(start + len(out)) % len(lines)])
        total += len(out[-1]) + 1
    return out


_SOURCE_WEIGHTS = {"prose": 0.55, "code": 0.2, "numbers": 0.25}


def _window(rng: random.Random, text: str, length: int) -> str:
    """A `length`-character piece of text, starting at a word where it can and not ending mid-word."""
    if len(text) <= length:
        return text
    start = rng.randrange(len(text) - length + 1)
    if length >= 8:
        space = text.rfind(" ", 0, start + 1)
        start = space + 1 if space >= 0 and start - space < length // 2 else start
    piece = text[start:start + length]
    if start + length < len(text) and text[start + length] != " ":
        cut = piece.rfind(" ")
        if cut >= int(length * 0.7):
            piece = piece[:cut]
    return piece.strip()


def sample_line_text(rng: random.Random, stage: CurriculumStage, allowed: frozenset[str]) -> str:
    length = rng.randint(stage.min_chars, stage.max_chars)
    for _ in range(100):
        source = rng.choices(list(_SOURCE_WEIGHTS), list(_SOURCE_WEIGHTS.values()))[0]
        cleaned = clean_text(" ".join(_passage(rng, source, length)), allowed)
        text = _window(rng, cleaned, length)
        if len(text) >= stage.min_chars:
            return text
    return "".join(rng.choice(sorted(allowed - {" "})) for _ in range(length))


def sample_paragraph(rng: random.Random, stage: CurriculumStage, allowed: frozenset[str]) -> list[str]:
    n_lines = rng.randint(1, stage.max_lines)
    if n_lines == 1:
        return [sample_line_text(rng, stage, allowed)]
    width = rng.randint(stage.min_chars, stage.max_chars)
    source = rng.choices(list(_SOURCE_WEIGHTS), list(_SOURCE_WEIGHTS.values()))[0]
    if source == "code":  # code keeps its own line breaks
        lines = [clean_text(x, allowed)[:width].rstrip() for x in _passage(rng, "code", 10_000)[:n_lines]]
        lines = [x for x in lines if x]
    else:
        cleaned = clean_text(" ".join(_passage(rng, source, width * (n_lines + 1))), allowed)
        lines = textwrap.wrap(_window(rng, cleaned, width * (n_lines + 1)), width)[:n_lines]
    return lines or [sample_line_text(rng, stage, allowed)]
