"""The feature cache of `gravityocr train-strips`: the frozen tower's token features of every
corpus item, and the recogniser as the training objective sees it over them.

The pretrained tower stays frozen, so its token features are computed once per item and
cached to disk (`cache` step, resumable, chunk by chunk): one file per corpus shard, named
after the shard. `CachedTowerView` and `to_sample` let the joint loss run on cached items
instead of pixels.
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from gravityocr.model.training.joint_loss import TrainingSample
from gravityocr.model.network.loading import Recognizer
from gravityocr.model.network.modeling import GravityOcrForConditionalGeneration
from gravityocr.model.network.processor import EncodedPrompt, OcrProcessor
from gravityocr.model.training.strip_train_config import StripTrainConfig
from gravityocr.model.network.strip_vision import MERGE
from gravityocr.model.decode.reading_drafts import reading_with_eos


@dataclass
class CachedItem:
    id: str
    type: str
    features: torch.Tensor  # (tokens, 1512) float16
    grid: torch.Tensor  # (1, 3)
    target_ids: list[int]
    text: str


def build_feature_cache(config: StripTrainConfig, recognizer: Recognizer, log=print) -> None:
    """Token features of every corpus item of the configured types, one cache file per corpus
    shard; shards already cached are skipped and shards that appeared meanwhile are picked up,
    so a stopped cache build resumes and a growing corpus is followed until it stops growing."""
    import io

    import pyarrow.parquet as pq
    from PIL import Image

    cache = Path(config.cache)
    cache.mkdir(parents=True, exist_ok=True)
    corpus = Path(config.corpus)
    while True:
        shards = sorted(s for s in corpus.glob("shards/**/*.parquet") if s.parts[-3] in config.types)
        todo = [s for s in shards if not (cache / _cache_name(corpus, s)).exists()]
        if not todo:
            return
        random.Random(config.seed).shuffle(todo)  # the cache grows evenly over packages and types
        for shard in todo:
            started = time.perf_counter()
            items = []
            with torch.inference_mode():
                for row in pq.read_table(shard).to_pylist():
                    image = Image.open(io.BytesIO(row["image"])).convert("RGB")
                    item = cached_item(recognizer, config, row["id"], row["type"], row["text"], image)
                    if item is not None:
                        items.append(item)
            path = cache / _cache_name(corpus, shard)
            partial = path.with_suffix(".partial")
            torch.save([asdict(item) for item in items], partial)
            partial.rename(path)
            rate = len(items) / max(time.perf_counter() - started, 1e-9)
            log(f"{path.name}: {len(items)} items, {rate:.1f}/s")


def cached_item(recognizer: Recognizer, config: StripTrainConfig, item_id: str, type: str, text: str,
                image) -> CachedItem | None:
    """One item's tower features and target, or None when its target is too long to train on."""
    processor = recognizer.processor
    target = processor.tokenizer.encode(text, add_special_tokens=False) + [processor.eos_token_ids[0]]
    if len(target) > config.max_target_tokens:
        return None
    pixels = processor.image_processor(images=[image])
    features = recognizer.model.strip_vision.token_features(pixels["pixel_values"], pixels["image_grid_thw"])[0]
    return CachedItem(item_id, type, features.half(), pixels["image_grid_thw"], target, text)


@torch.inference_mode()
def evaluation_set_items(config: StripTrainConfig, recognizer: Recognizer) -> list[CachedItem]:
    """The items of `config.validation_set` (an evaluation manifest) of the configured types,
    with their tower features, in manifest order."""
    from PIL import Image

    from gravityocr.model.evaluation.manifest import read_manifest

    items = []
    for entry in read_manifest(config.validation_set):
        if entry.type in config.types:
            item = cached_item(recognizer, config, entry.id, entry.type, entry.text,
                               Image.open(entry.image_path).convert("RGB"))
            if item is not None:
                items.append(item)
    return items


def _cache_name(corpus: Path, shard: Path) -> str:
    return shard.relative_to(corpus / "shards").as_posix().replace("/", "--").replace(".parquet", ".pt")


def read_cache(cache: Path, max_visual_tokens: int | None = None) -> list[CachedItem]:
    items = []
    for path in sorted(Path(cache).glob("*.pt")):
        items += [CachedItem(**record) for record in torch.load(path, weights_only=False)]
    if max_visual_tokens is not None:
        items = [item for item in items if item.features.shape[0] <= max_visual_tokens]
    return items


class CachedTowerView(nn.Module):
    """The recogniser as the joint loss sees it, with the frozen tower's output given
    instead of pixels: `encode_images` only projects cached token features."""

    def __init__(self, model: GravityOcrForConditionalGeneration):
        super().__init__()
        self.model = model
        self.config = model.config
        self.mask_token_id = model.mask_token_id

    @property
    def device(self):
        return self.model.device

    def encode_images(self, features: torch.Tensor, image_grid_thw: torch.Tensor,
                      readings: list | None = None, frames: list | None = None) -> list[torch.Tensor]:
        counts = (image_grid_thw.prod(dim=1) // 4).tolist()
        return self.model.embed_strip_features(list(features.float().split(counts)), image_grid_thw, readings, frames)

    @property
    def copies_reading(self) -> bool:
        return self.model.copies_reading

    @property
    def ctc_prefix_weight(self) -> float:
        return self.model.ctc_prefix_weight

    def embed(self, *args, **kwargs):
        return self.model.embed(*args, **kwargs)

    def logits_from_embeds(self, *args, **kwargs):
        return self.model.logits_from_embeds(*args, **kwargs)

    def rope_positions(self, *args, **kwargs):
        return self.model.rope_positions(*args, **kwargs)


def to_sample(item: CachedItem, processor: OcrProcessor,
              model: GravityOcrForConditionalGeneration | None = None) -> TrainingSample:
    """The item as a training sample; with a `model` that copies its reading, with the reading
    (what the frozen classifier reads from the cached features, the eos after it)."""
    ids = processor.prompt_ids_for(item.grid, item.type)
    prompt = EncodedPrompt(torch.tensor([ids]), item.features, item.grid, item.type)
    reading = None
    if model is not None and model.copies_reading:
        vision, (_, grid_h, grid_w) = model.strip_vision, item.grid[0].tolist()
        with torch.no_grad():
            read = vision.reading(vision.reading_logits(item.features.float()), grid_h // MERGE, grid_w // MERGE,
                                  model.reading_prefix)
        reading = reading_with_eos(read, frozenset(processor.eos_token_ids))
    return TrainingSample(prompt, item.target_ids, reading)
