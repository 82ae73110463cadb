"""Regenerates the bundled sample documents (run from the repository root):

    python -m gravityocr.corpus.make_samples

notice.png     one page of short monospace lines, the kind the small default model reads best
report.pdf     two generated pages: title, paragraphs, a table and a formula
columns.jpg    a generated two-column page, as a JPEG scan
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
from PIL import Image, ImageDraw, ImageFont

from gravityocr.corpus import synthetic_pages

HERE = Path(__file__).resolve().parent.parent / "samples"
NOTICE_LINES = ["Opening hours", "Mon 9 to 17", "Tue 9 to 17", "Wed closed", "Thu 9 to 20", "Fri 9 to 15",
                "Tel 0123 4567"]


def notice() -> Image.Image:
    face = ImageFont.truetype(str(Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSansMono.ttf"), 40)
    page = Image.new("RGB", (1240, 1754), "white")
    draw = ImageDraw.Draw(page)
    for index, line in enumerate(NOTICE_LINES):
        draw.text((160, 200 + index * 110), line, font=face, fill="black")
    return page


def main() -> None:
    notice().save(HERE / "notice.png", optimize=True)
    (HERE / "report.pdf").write_bytes(synthetic_pages.pdf_bytes([synthetic_pages.single_column_page(seed=21),
                                                                 synthetic_pages.table_formula_page(seed=22, page_number=2)]))
    synthetic_pages.two_column_page(seed=23).image.convert("L").save(HERE / "columns.jpg", quality=85)


if __name__ == "__main__":
    main()
