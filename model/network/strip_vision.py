"""The PP-OCRv6 vision tower option: a crop becomes 48-px strips, a strip becomes visual
tokens of 24 px each, projected into the text decoder.

Why strips: the pretrained backbone and neck (model/network/ppocr_tower.py) read one text line
48 px high; that is what their weights know. Every crop is first scaled so that its
median glyph is `glyph_height` px high (measured from its connected components), which
makes the scale independent of how loose the crop's box is; a crop whose ink then fits
in 48 px is one strip, centred on its ink (a text line), and a taller one (a table, a
formula with fractions, a paragraph) is cut into 48-px strips every 24 px, so every text
line lies whole inside at least one strip.

Tokens: the neck gives one 120-d step per 8 px and the backbone's last map one 384-d
column per 4 px; per 8 px both are joined (504-d) and three steps make one 24-px token
(1512-d), normalised and projected to the decoder's width. Strips are rows of the token
grid, so GLM-OCR's 3-D rope gives token (row, column) its height and width positions as it
does for its own vision tower's merged patches.

Reading hint: the pretrained CTC classifier, restricted to the decoder's vocabulary (one
class per single-character token, plus blank), gives each 8-px step a distribution over
the characters it reads there; the three distributions of a token are projected and added
to its embedding. This turns the decoder's hardest job on long lines — finding the
visual position of the next character — into matching the token it just emitted against
what the columns read. The classifier is frozen pretrained weights; the hint's projection
starts at zero, so a model without it is the same function.

Reading prefix (models whose config has `reading_prefix`): what that classifier reads,
greedy CTC (best class per step, repeats and blanks collapsed, strips joined by a newline),
follows the visual tokens as ordinary text tokens of the decoder's own vocabulary, in
`reading_slots` placeholder positions (the rest filled with an empty token). The prefix's
k-th token takes the rope position of the k-th response token (GravityOcrForConditionalGeneration.
rope_positions), so on a line the character to write next is read one position ahead of the
one being written, at every length: a copy by position, which a content-matching copy loses
on a line that repeats a word. Every prefix token also carries one learned marker vector:
a prefix token and the response token at the same rope position are then told apart from the
first layer on (without it they are the same embedding at the same position). Correcting the
reading from the visual tokens, and turning it into a table's HTML or a formula's LaTeX, is
what the decoder is trained for. The slot count depends on the crop's size alone, so the
processor counts the prompt before the tower runs.

The processor hands the engine `pixel_values` of shape (cells, 3·48·24), one 48×24 cell
per visual token in row-major order, and `image_grid_thw` = (1, 2·rows, 2·columns): the
shape contract of GLM-OCR's processor (patches concatenated over a batch, a 2×2 merge
per token), so the engine, training and serving code stay unchanged.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn

from gravityocr.model.network.ppocr_tower import IMAGE_HEIGHT, PPOCRv6Recognizer, TowerConfig
from gravityocr.model.network.tokenizer import SPECIAL

PROCESSOR_TYPE = "StripImageProcessor"
CELL_WIDTH = 24  # px of a strip per visual token: three 8-px neck steps
STRIP_STRIDE = 24  # a tall crop's strips start every this many px
MERGE = 2  # the 2x2 merge GLM-OCR's grid counts in (image_grid_thw is in unmerged patches)
STEPS_PER_TOKEN = CELL_WIDTH // 8  # the neck's steps are 8 px apart
FEATURES_PER_STEP = 120 + 384
FEATURES_PER_TOKEN = FEATURES_PER_STEP * STEPS_PER_TOKEN
# Vertical detail (config `strip_vertical_detail`): the backbone map's top and bottom rows (of
# the three a 48-px strip gives), less their mean, per 8 px: where in the strip the ink lies.
VERTICAL_PER_TOKEN = 2 * 384 * STEPS_PER_TOKEN
INK_LEVEL = 128  # a pixel darker than this is ink


@dataclass
class StripImageProcessor:
    """Crop -> strips -> cells; saved as preprocessor_config.json beside the weights."""

    glyph_height: float = 20.0  # median connected-component height after scaling, px
    single_line_slack: float = 1.3  # an ink band up to this many strips high is squeezed into one
    min_width: int = 336  # strips are padded to at least this (PP-OCR pads lines to >= 320 px)
    max_width: int = 1920  # wider strips are squeezed horizontally (80 tokens a row)
    max_rows: int = 24  # taller crops are squeezed vertically (at most 1920 visual tokens)
    merge_size: int = MERGE  # read by OcrProcessor to count visual tokens

    # --- the transformers-style surface OcrProcessor and loading use -----------------------

    def __call__(self, images, return_tensors: str = "pt") -> dict[str, torch.Tensor]:
        cells, grids, content = [], [], []
        for image in images:
            strips, width = self._strips(image)
            rows, columns = strips.shape[0], strips.shape[3] // CELL_WIDTH
            # (rows, 3, 48, columns*24) -> (rows*columns, 3*48*24), row-major
            cell = strips.reshape(rows, 3, IMAGE_HEIGHT, columns, CELL_WIDTH).permute(0, 3, 1, 2, 4)
            cells.append(cell.reshape(rows * columns, 3 * IMAGE_HEIGHT * CELL_WIDTH))
            grids.append(torch.tensor([[1, MERGE * rows, MERGE * columns]]))
            content.append(math.ceil(width / CELL_WIDTH))
        # content_columns: the columns the crop itself fills, before the padding to min_width
        # (what a crop can hold: OcrProcessor.output_budget)
        return {"pixel_values": torch.cat(cells), "image_grid_thw": torch.cat(grids),
                "content_columns": torch.tensor(content)}

    def save_pretrained(self, directory: str | Path) -> None:
        record = {"image_processor_type": PROCESSOR_TYPE, **asdict(self)}
        (Path(directory) / "preprocessor_config.json").write_text(json.dumps(record, indent=2) + "\n")

    @classmethod
    def from_dict(cls, record: dict) -> "StripImageProcessor":
        return cls(**{k: v for k, v in record.items() if k != "image_processor_type"})

    # --- the normalisation ----------------------------------------------------------------

    def scale_for(self, gray: np.ndarray) -> float:
        """Scale that brings the crop's median glyph to `glyph_height` px. Where marks (under
        0.4 of the median height of the tallest fifth of the components: dots, commas) are
        most of the components, as on a dot-leader line of a table of contents, the median is
        taken over the rest: a dot's height would blow the letters up past one strip."""
        import cv2

        _, ink = cv2.threshold(gray, 0, 1, cv2.THRESH_BINARY_INV + cv2.THRESH_OTSU)
        count, _, stats, _ = cv2.connectedComponentsWithStats(ink, connectivity=8)
        heights = stats[1:, cv2.CC_STAT_HEIGHT]
        areas = stats[1:, cv2.CC_STAT_AREA]
        # Specks and rules say nothing about the text size.
        glyphs = heights[(areas >= 6) & (heights >= 3) & (heights < gray.shape[0] * 0.95)]
        if glyphs.size == 0:
            return IMAGE_HEIGHT / max(gray.shape[0], 1)
        median = float(np.median(glyphs))
        mark = 0.4 * float(np.median(np.sort(glyphs)[-max(1, glyphs.size // 5):]))
        if median < mark:
            median = float(np.median(glyphs[glyphs >= mark]))
        return self.glyph_height / median

    @staticmethod
    def _ink_rows(gray: np.ndarray) -> np.ndarray:
        """Indices of the rows that hold ink: pixels darker than mid-grey; in a crop with
        none that dark (a faint scan's grey text), darker than Otsu's threshold between its
        paper and its ink, as `scale_for` finds glyphs."""
        import cv2

        dark = gray < INK_LEVEL
        if not dark.any():
            threshold, _ = cv2.threshold(gray, 0, 255, cv2.THRESH_BINARY + cv2.THRESH_OTSU)
            dark = gray < threshold
        return np.nonzero(dark.any(axis=1))[0]

    @classmethod
    def _ink_band(cls, gray: np.ndarray) -> int:
        rows = cls._ink_rows(gray)
        return int(rows[-1] - rows[0] + 1) if rows.size else gray.shape[0]

    def strips(self, image: Image.Image) -> torch.Tensor:
        """(rows, 3, 48, W) normalised as PP-OCR expects (BGR, (x/255-0.5)/0.5, zero padding)."""
        return self._strips(image)[0]

    def _strips(self, image: Image.Image) -> tuple[torch.Tensor, int]:
        """`strips`, and the width in px the scaled crop fills of them."""
        import cv2

        rgb = np.asarray(image.convert("RGB"))
        gray = evened(cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY))
        scale = self.scale_for(gray)
        band = self._ink_band(gray)
        if IMAGE_HEIGHT < band * scale <= IMAGE_HEIGHT * self.single_line_slack:
            scale = IMAGE_HEIGHT / band  # a line with tall brackets or a big heading stays one line
        height = max(1, round(rgb.shape[0] * scale))
        width = max(1, round(rgb.shape[1] * scale))
        width = min(width, self.max_width)
        height = min(height, IMAGE_HEIGHT + STRIP_STRIDE * (self.max_rows - 1))
        bgr = cv2.resize(np.ascontiguousarray(rgb[:, :, ::-1]), (width, height), interpolation=cv2.INTER_LINEAR)
        ink_rows = self._ink_rows(cv2.resize(gray, (width, height), interpolation=cv2.INTER_LINEAR))
        top, bottom = (int(ink_rows[0]), int(ink_rows[-1]) + 1) if ink_rows.size else (0, height)
        if bottom - top <= IMAGE_HEIGHT:  # one line: centre its ink in one strip
            centre = (top + bottom) // 2
            starts = [centre - IMAGE_HEIGHT // 2]
        else:
            rows = math.ceil((bottom - top - IMAGE_HEIGHT) / STRIP_STRIDE) + 1
            starts = [top + STRIP_STRIDE * row for row in range(rows)]
        padded_width = max(self.min_width, math.ceil(width / CELL_WIDTH) * CELL_WIDTH)
        padded_width = math.ceil(padded_width / CELL_WIDTH) * CELL_WIDTH
        out = np.zeros((len(starts), 3, IMAGE_HEIGHT, padded_width), dtype=np.float32)
        normalised = (bgr.astype(np.float32) / 255.0 - 0.5) / 0.5  # (H, W, 3)
        white = (1.0 - 0.5) / 0.5
        for row, start in enumerate(starts):
            strip = np.full((IMAGE_HEIGHT, width, 3), white, dtype=np.float32)  # page around the crop is paper
            lo, hi = max(start, 0), min(start + IMAGE_HEIGHT, height)
            if hi > lo:
                strip[lo - start:hi - start] = normalised[lo:hi]
            out[row, :, :, :width] = strip.transpose(2, 0, 1)
        return torch.from_numpy(out), width


DIM_PAPER = 200  # paper (the crop's brightest tenth) darker than this is under poor light
UNEVEN_PAPER = 0.15  # or paper that falls by this share across the crop


def evened(gray: np.ndarray) -> np.ndarray:
    """The grey crop the strips' geometry is measured on (glyph size, ink rows): as it is on
    paper that is white and even, else divided by its paper's own brightness (a grey closing
    wider than any stroke), so that a dim or unevenly lit crop (a photographed page) finds
    its ink as a scan does. The pixels the tower reads are not changed."""
    import cv2

    paper = float(np.percentile(gray, 90))
    size = max(15, gray.shape[0] // 2) | 1
    background = cv2.morphologyEx(gray, cv2.MORPH_CLOSE, cv2.getStructuringElement(cv2.MORPH_RECT, (size, size)))
    low, high = np.percentile(background, [5, 95])
    if paper >= DIM_PAPER and (high - low) < UNEVEN_PAPER * high:
        return gray
    flat = gray.astype(np.float32) / np.maximum(background.astype(np.float32), 1.0)
    return np.clip(flat * 255.0, 0, 255).astype(np.uint8)


def cells_to_strips(cells: torch.Tensor, rows: int, columns: int) -> torch.Tensor:
    """One image's (rows*columns, 3*48*24) cells back into its (rows, 3, 48, columns*24) strips."""
    strips = cells.reshape(rows, columns, 3, IMAGE_HEIGHT, CELL_WIDTH).permute(0, 2, 3, 1, 4)
    return strips.reshape(rows, 3, IMAGE_HEIGHT, columns * CELL_WIDTH)


def reading_head_weights(ctc_head: nn.Linear, characters: list[str], vocab: dict[str, int],
                         vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The CTC classifier's rows for the decoder's single-character tokens (row `vocab_size`
    is blank, class 0); tokens it has no class for get a bias that makes them never read."""
    weight = torch.zeros(vocab_size + 1, ctc_head.in_features)
    bias = torch.full((vocab_size + 1,), UNREAD_BIAS)
    classes = {character: index for index, character in enumerate(characters) if index > 0}
    rows = {token_id: classes[token] for token, token_id in vocab.items() if token in classes}
    rows[vocab_size] = 0
    with torch.no_grad():
        for token_id, index in rows.items():
            weight[token_id] = ctc_head.weight[index].float()
            bias[token_id] = ctc_head.bias[index].float()
    return weight, bias


UNREAD_BIAS = -30.0

# Reading prefix length: collapsed characters per 8-px step stay under 0.8 on real text lines
# scaled to the glyph height (data/real: median 0.39, largest 0.75); a table's prefix is cut.
READING_SLOTS_PER_STEP = 0.8
MAX_READING_SLOTS = 512


def reading_slots(rows: int, columns: int) -> int:
    """Reading-prefix positions of a crop of `rows` strips of `columns` visual tokens."""
    return min(MAX_READING_SLOTS, rows * math.ceil(READING_SLOTS_PER_STEP * STEPS_PER_TOKEN * columns))


@dataclass(frozen=True)
class ReadingPrefix:
    """Token ids of the reading prefix, stored in the model config as `reading_prefix`."""

    placeholder_id: int  # marks the prefix's positions in a prompt
    newline_id: int  # joins the readings of a crop's strips
    empty_id: int  # fills the positions past the reading

    @classmethod
    def for_tokenizer(cls, tokenizer) -> "ReadingPrefix":
        """The character tokenizer's video placeholder, which a strip model never uses
        otherwise, marks the prefix; an unread position holds the pad token."""
        return cls(placeholder_id=tokenizer.convert_tokens_to_ids(SPECIAL.video),
                   newline_id=tokenizer.convert_tokens_to_ids("\n"), empty_id=tokenizer.pad_token_id)

    @classmethod
    def of(cls, config) -> "ReadingPrefix | None":
        record = getattr(config, "reading_prefix", None)
        return cls(**record) if record else None


class StripVisionTower(nn.Module):
    """PP-OCRv6 backbone + neck (pretrained), the projection of their 24-px tokens and the
    reading hint (module docstring)."""

    def __init__(self, hidden_size: int, vocab_size: int, tower_config: TowerConfig | None = None,
                 vertical_detail: bool = False):
        super().__init__()
        self.recognizer = PPOCRv6Recognizer(tower_config)
        del self.recognizer.head  # the CTC classifier over 18,710 classes: restricted below
        self.norm = nn.LayerNorm(FEATURES_PER_TOKEN)
        self.projection = nn.Linear(FEATURES_PER_TOKEN, hidden_size)
        neck_dim = self.recognizer.config.neck_dim
        self.reading_head = nn.Linear(neck_dim, vocab_size + 1)
        self.reading_projection = nn.Linear(STEPS_PER_TOKEN * (vocab_size + 1), hidden_size, bias=False)
        # added to every reading-prefix token: the decoder tells the prefix's characters from
        # its own output's at the first layer (zero: a model saved without it is unchanged)
        self.reading_marker = nn.Parameter(torch.zeros(hidden_size))
        with torch.no_grad():
            self.reading_projection.weight.zero_()
        if vertical_detail:
            # the map's rows kept apart: a superscript, a fraction's numerator and denominator
            # lie at different heights of one strip, which the averaged map cannot tell apart
            # (zero at the start: a model gains it as the same function)
            self.vertical_norm = nn.LayerNorm(VERTICAL_PER_TOKEN)
            self.vertical_projection = nn.Linear(VERTICAL_PER_TOKEN, hidden_size, bias=False)
            with torch.no_grad():
                self.vertical_projection.weight.zero_()

    @property
    def vertical_detail(self) -> bool:
        return hasattr(self, "vertical_projection")

    def token_features(self, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor) -> list[torch.Tensor]:
        """Per image, (rows*columns, 1512) features before the projection (what training caches);
        with vertical detail, (rows*columns, 1512 + VERTICAL_PER_TOKEN)."""
        out = []
        start = 0
        for _, grid_h, grid_w in image_grid_thw.tolist():
            rows, columns = grid_h // MERGE, grid_w // MERGE
            strips = cells_to_strips(pixel_values[start:start + rows * columns], rows, columns)
            start += rows * columns
            tower = self.recognizer(strips.to(self.norm.weight.dtype))
            steps = columns * (CELL_WIDTH // 8)
            sequence = tower.sequence[:, :steps]  # (rows, steps, 120)
            # the map's 4-px columns, averaged over its height and per pair: one 384-d vector per 8 px
            column_map = tower.feature_map.mean(dim=2)[:, :, :2 * steps]
            column_map = column_map.reshape(rows, -1, steps, 2).mean(dim=3).transpose(1, 2)  # (rows, steps, 384)
            per_step = torch.cat([sequence, column_map], dim=2)
            features = per_step.reshape(rows * columns, FEATURES_PER_TOKEN)
            if self.vertical_detail:
                paired = tower.feature_map[:, :, :, :2 * steps].reshape(rows, 384, -1, steps, 2).mean(dim=4)
                detail = paired[:, :, [0, -1]] - paired.mean(dim=2, keepdim=True)  # (rows, 384, 2, steps)
                detail = detail.permute(0, 3, 2, 1).reshape(rows * columns, VERTICAL_PER_TOKEN)
                features = torch.cat([features, detail], dim=1)
            out.append(features)
        return out

    def reading_logits(self, features: torch.Tensor) -> torch.Tensor:
        """(tokens, 1512) features -> (tokens, 3, vocab + 1): the classifier's logits for each
        8-px step (what the hint projects and the prefix reads; computed once per image)."""
        neck_dim = self.recognizer.config.neck_dim
        features = features[:, :FEATURES_PER_TOKEN]
        steps = features.reshape(features.shape[0], STEPS_PER_TOKEN, FEATURES_PER_STEP)[:, :, :neck_dim]
        return self.reading_head(steps.to(self.reading_head.weight.dtype))

    def reading(self, reading_logits: torch.Tensor, rows: int, columns: int, prefix: ReadingPrefix) -> list[int]:
        """The greedy CTC reading of each strip, strips joined by a newline, as token ids,
        cut to the prefix's slots."""
        best = reading_logits.reshape(rows, columns * STEPS_PER_TOKEN, -1).argmax(dim=-1)
        blank = self.reading_head.out_features - 1
        previous = torch.nn.functional.pad(best, (1, 0), value=blank)[:, :-1]
        read = (best != blank) & (best != previous)
        ids: list[int] = []
        for row in range(rows):
            if row:
                ids.append(prefix.newline_id)
            ids += best[row][read[row]].tolist()
        return ids[:reading_slots(rows, columns)]

    def reading_ids(self, reading: list[int], rows: int, columns: int, prefix: ReadingPrefix,
                    device: torch.device) -> torch.Tensor:
        """(reading_slots(rows, columns),) token ids: the `reading`, padded with the empty token."""
        slots = reading_slots(rows, columns)
        return torch.tensor(reading + [prefix.empty_id] * (slots - len(reading)), dtype=torch.long, device=device)

    def project(self, features: torch.Tensor, reading_logits: torch.Tensor) -> torch.Tensor:
        """(tokens, 1512) features and their `reading_logits` -> (tokens, hidden) visual-token
        embeddings."""
        reading = reading_logits.softmax(dim=-1)
        hint = self.reading_projection(reading.flatten(1).to(self.reading_projection.weight.dtype))
        visual = self.projection(self.norm(features[:, :FEATURES_PER_TOKEN])) + hint
        if self.vertical_detail:
            visual = visual + self.vertical_projection(self.vertical_norm(features[:, FEATURES_PER_TOKEN:]))
        return visual
