"""The settings of a `gravityocr train-strips` run (`StripTrainConfig`), read from a recipe YAML
(recipes/strips.yaml) and checked by `validate`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gravityocr.model.training.recipes import read_recipe


@dataclass
class StripTrainConfig:
    corpus: str = "runs/corpus"  # a `gravityocr data build` directory
    cache: str = "runs/strip-features"  # token features of the frozen tower, by chunk
    output_dir: str = "runs/strips"
    init_from: str = "model/default"  # text decoder, mask embedding, tokenizer
    tower_weights: str = ""  # `convert_onnx` output; "" converts rapidocr's bundled file
    reading_prefix: bool = False  # the decoder also reads the classifier's text (model/network/strip_vision.py)
    reading_copy: bool = False  # and gets the reading's token at its place as input (model/decode/reading_drafts.py)
    vertical_detail: bool = False  # the backbone map's rows kept apart (model/network/strip_vision.py)
    # Draw items of a type in proportion to their text's length (each type keeps its share of
    # the batch): a corpus build's text items are mostly words and short lines, a page's are long.
    sample_by_length: bool = False
    # Each type's share of the draws (types without one are not drawn): a few text lines beside
    # many formulas keep the reader of lines while formulas are learned. None: shares by count.
    type_shares: dict[str, float] | None = None
    types: tuple[str, ...] = ("text", "table", "formula")
    max_target_tokens: int = 400  # longer targets are left out of training
    max_visual_tokens: int = 1200  # so are larger images (a whole page of table)
    micro_batch_tokens: int = 6000  # a step runs as length-sorted micro-batches of at most this many
    validation_items: int = 120  # items held out of the cache's last chunk, read greedily
    validation_set: str = ""  # validate on this evaluation set's items of `types` instead (data/dev)
    steps: int = 6000
    projection_steps: int = 300
    batch_size: int = 24
    learning_rate: float = 3e-4
    projection_learning_rate: float = 1e-3
    min_learning_rate: float = 3e-5
    warmup_steps: int = 50
    weight_decay: float = 0.01
    clip_norm: float = 1.0
    block_size: int = 32
    min_block_size: int = 8
    seed: int = 0
    threads: int = 1
    checkpoint_every: int = 250
    validate_every: int = 500
    max_seconds: float = 0.0  # >0: stop (with a checkpoint) after this long
    stop_step: int = 0  # >0: stop (with a checkpoint) at this step of the `steps`-long schedule

    @classmethod
    def from_file(cls, path: str | Path) -> "StripTrainConfig":
        return read_recipe(cls, path)

    def validate(self) -> None:
        self.types = tuple(self.types)
        if self.projection_steps >= self.steps:
            raise ValueError("projection_steps must be fewer than steps")
        if self.batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if self.type_shares is not None and (set(self.type_shares) - set(self.types)
                                             or any(share < 0 for share in self.type_shares.values())
                                             or not sum(self.type_shares.values()) > 0):
            raise ValueError(f"type_shares must give non-negative shares of some of types {list(self.types)}, "
                             f"got {self.type_shares}")
