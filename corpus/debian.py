"""Fetch and unpack Debian documentation packages into a cache outside git.

`apt-get download` fetches the .deb (no root, no install scripts), `dpkg -x` unpacks it.
Packages reserved for independent evaluation are refused by name before anything is
fetched or read, wherever a package name enters the corpus code.
"""

from __future__ import annotations

import fnmatch
import gzip
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

# Reserved for independent evaluation: never read for training, tuning or our own
# evaluation sets. Patterns are fnmatch-style (python3*-doc covers every Python's docs).
RESERVED_PACKAGES = (
    "r-doc-pdf",
    "octave-doc",
    "gnuplot-doc",
    "python3*-doc",
    "texlive-publishers-doc",
    "texlive-science-doc",
    "texlive-metapost-doc",
    "texlive-latex-base-doc",
    "texlive-latex-recommended-doc",
    "texlive-humanities-doc",
    "texlive-fonts-recommended-doc",
)


# Paths inside other packages that hold copies of reserved packages' documents (the
# development snapshot of LaTeX's own sources ships amsmath's manual and test files).
RESERVED_COPIES = ("/latex-dev/",)
DEFAULT_CACHE = Path.home() / ".cache" / "gravityocr" / "debian"  # downloaded and unpacked packages


class ReservedPackage(ValueError):
    """A package set aside for independent evaluation was asked for."""


def is_reserved(package: str) -> bool:
    name = package.strip().lower()
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in RESERVED_PACKAGES)


def check_not_reserved(package: str) -> str:
    if is_reserved(package):
        raise ReservedPackage(
            f"{package!r} is reserved for independent evaluation and is never read by the corpus "
            f"builder (reserved: {', '.join(RESERVED_PACKAGES)})"
        )
    return package


@dataclass(frozen=True)
class UnpackedPackage:
    name: str
    root: Path  # the unpacked tree: root / "usr/share/doc/..."
    licence: str
    only: frozenset[str] | None = None  # a view of these files (relative paths) alone

    def files(self, *suffixes: str) -> list[Path]:
        """Files under the tree with one of `suffixes` (".pdf", ".html" ...), gzipped or not, sorted."""
        wanted = tuple(s.lower() for s in suffixes) + tuple(s.lower() + ".gz" for s in suffixes)
        if self.only is not None:  # a view lists its own files: no walk of the whole tree per unit
            return sorted(p for p in (self.root / name for name in self.only) if p.name.lower().endswith(wanted))
        # Symbolic links are the same file under a second name (texmf trees link into /usr/share/doc).
        return sorted(p for p in self.root.rglob("*")
                      if p.is_file() and not p.is_symlink() and p.name.lower().endswith(wanted)
                      and not any(copy in "/" + self.relative(p) for copy in RESERVED_COPIES))

    def restricted_to(self, relative_paths) -> "UnpackedPackage":
        """The same package seen through a subset of its files (a unit of a resumable build)."""
        return UnpackedPackage(self.name, self.root, self.licence, frozenset(relative_paths))

    @staticmethod
    def read_bytes(path: Path) -> bytes:
        """The file's content, gunzipped where Debian compressed it."""
        data = path.read_bytes()
        return gzip.decompress(data) if path.name.endswith(".gz") else data

    def relative(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()


_LICENSE_LINE = re.compile(r"^License:\s*(\S.*)$", re.MULTILINE)


def read_licence(root: Path, package: str) -> str:
    """The first `License:` of the package's machine-readable copyright file, else "see copyright"."""
    for copyright_file in sorted(root.glob("usr/share/doc/*/copyright")):
        text = copyright_file.read_text(errors="replace")
        match = _LICENSE_LINE.search(text)
        if match:
            return match.group(1).strip()
    return f"see /usr/share/doc/{package}/copyright"


def fetch_package(package: str, cache: Path) -> UnpackedPackage:
    """The package unpacked under `cache/<package>/`, downloading it only once."""
    check_not_reserved(package)
    cache = Path(cache)
    debs = cache / "debs"
    root = cache / "unpacked" / package
    done = root / ".unpacked"
    if not done.exists():
        debs.mkdir(parents=True, exist_ok=True)
        deb = _find_deb(debs, package)
        if deb is None:
            result = subprocess.run(["apt-get", "download", package], cwd=debs, capture_output=True, text=True)
            deb = _find_deb(debs, package)
            if deb is None:
                raise RuntimeError(f"apt-get download {package} failed: {result.stderr.strip()[-500:]}")
        root.mkdir(parents=True, exist_ok=True)
        subprocess.run(["dpkg", "-x", str(deb), str(root)], check=True)
        done.touch()
    return UnpackedPackage(package, root, read_licence(root, package))


def _find_deb(directory: Path, package: str) -> Path | None:
    found = sorted(directory.glob(f"{package}_*.deb"))
    return found[-1] if found else None
