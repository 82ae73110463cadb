"""Auxiliary CTC loss on the vision tower's patch columns (training only, never exported).

Why: the decoder alone gives the vision tower a weak, indirect signal, and a small tower
trained that way collapses or learns only the first characters (shared notes). A CTC head
reading a single text line left to right from the tower's patch columns (14 px each, about
two per character at our font scale) trains the tower to say which character is where.
The head sits on the tower's last hidden states (before the 2×2 merge), so the network
the engine runs — and the GLM-OCR code path — is unchanged.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from .modeling import GravityOcrForConditionalGeneration


class ColumnCtcHead(nn.Module):
    def __init__(self, model: GravityOcrForConditionalGeneration):
        super().__init__()
        vision = model.model.visual
        self.merge = vision.spatial_merge_size
        self.blank = model.config.text_config.vocab_size
        self.classifier = nn.Linear(vision.config.hidden_size, self.blank + 1)
        self._captured: torch.Tensor | None = None

    @contextmanager
    def capturing(self, model: GravityOcrForConditionalGeneration) -> Iterator[None]:
        """Keep the patch features (just before the merge) of `model`'s forward passes run
        inside; the model is left without a hook afterwards (evaluation never sees the head)."""
        handle = model.model.visual.post_layernorm.register_forward_hook(self._capture)
        try:
            yield
        finally:
            handle.remove()

    def _capture(self, module, inputs, output) -> None:
        self._captured = output

    @staticmethod
    def _readable(width: int, label: list[int] | None) -> bool:
        return bool(label) and width >= 2 * len(label)  # CTC needs room for blanks between repeats

    def count_readable(self, image_grid_thw: torch.Tensor, labels: list[list[int] | None]) -> int:
        """How many images the loss reads: single text lines wide enough for their labels."""
        return sum(self._readable(w, label) for (_, _, w), label in zip(image_grid_thw.tolist(), labels))

    def loss(self, image_grid_thw: torch.Tensor, labels: list[list[int] | None],
             normalizer: int | None = None) -> torch.Tensor:
        """CTC over the patch columns of the readable images (see count_readable); the row
        mean of a column is its feature. Each image's loss is divided by its label length,
        the sum by `normalizer` (a whole step's readable count, for one of its micro-batches;
        by default this batch's). Zero when no image in the batch is readable."""
        features = self._captured
        if features is None:
            raise RuntimeError("no vision forward pass captured yet")
        columns, targets = [], []
        start = 0
        for (t, h, w), label in zip(image_grid_thw.tolist(), labels):
            count = t * h * w
            if self._readable(w, label):
                patches = features[start:start + count]
                # Patches arrive in merge-window order (t, h/m, w/m, m, m): back to a (h, w) grid.
                grid = patches.view(t, h // self.merge, w // self.merge, self.merge, self.merge, -1)
                grid = grid.permute(0, 1, 3, 2, 4, 5).reshape(t, h, w, -1)
                columns.append(grid.mean(dim=(0, 1)))
                targets.append(torch.tensor(label, dtype=torch.long))
            start += count
        self._captured = None
        if not columns:
            return features.new_zeros(())
        lengths = torch.tensor([c.shape[0] for c in columns])
        padded = nn.utils.rnn.pad_sequence(columns)  # (T, N, C)
        log_probs = self.classifier(padded).float().log_softmax(-1)
        target_lengths = torch.tensor([t.numel() for t in targets])
        per_image = F.ctc_loss(log_probs, torch.cat(targets), lengths, target_lengths, blank=self.blank,
                               reduction="none", zero_infinity=True)
        return (per_image / target_lengths.to(per_image.device)).sum() / (normalizer or len(columns))
