"""The GravityOCR network: GLM-OCR plus one learned mask-token embedding.

Everything else is GLM-OCR as transformers defines it, so `zai-org/GLM-OCR` (or any local
directory in Hugging Face format) loads with `from_pretrained`; a checkpoint without the
mask embedding gets it freshly initialised, ready for joint training.

The decoding and training code calls three small methods below rather than `forward`,
because both need explicit 4-D attention masks and 3-D rope positions that GLM-OCR's
own `forward` would otherwise infer for plain causal decoding.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import GlmOcrConfig, GlmOcrForConditionalGeneration
from transformers import initialization as hf_init
from transformers.cache_utils import Cache


GLM_TOWER = "glm"  # GLM-OCR's own vision tower (GLM-OCR checkpoints, tiny test configs)
STRIP_TOWER = "ppocr-strips"  # the pretrained PP-OCRv6 line reader over 48-px strips


def vision_tower_of(config: GlmOcrConfig) -> str:
    """The config's `vision_tower` option; absent (GLM-OCR checkpoints) means GLM-OCR's own."""
    tower = getattr(config, "vision_tower", GLM_TOWER)
    if tower not in (GLM_TOWER, STRIP_TOWER):
        raise ValueError(f"unknown vision_tower {tower!r}; expected {GLM_TOWER!r} or {STRIP_TOWER!r}")
    return tower


class GravityOcrForConditionalGeneration(GlmOcrForConditionalGeneration):
    """GLM-OCR with a learned embedding for the mask token used by block-diffusion drafts.

    `config.mask_token_id` names the id that stands for the mask in input ids; its row of
    the token embedding (if any) is never read: `mask_embedding` replaces it.
    """

    def __init__(self, config: GlmOcrConfig):
        super().__init__(config)
        if vision_tower_of(config) == STRIP_TOWER:
            # The pretrained PP-OCRv6 line reader replaces GLM-OCR's vision tower
            # (model/network/strip_vision.py); the text decoder and everything after it are unchanged.
            from gravityocr.model.network.strip_vision import StripVisionTower

            del self.model.visual
            self.strip_vision = StripVisionTower(config.text_config.hidden_size, config.text_config.vocab_size,
                                                 vertical_detail=bool(getattr(config, "strip_vertical_detail", False)))
        if getattr(config, "reading_copy", False):
            if getattr(config, "reading_prefix", None) is None:
                raise ValueError("reading_copy needs a reading prefix (config reading_prefix)")
            # The copy path: the reading's token at the place the text has reached
            # (model/decode/reading_drafts.py) is projected into the input of the position that
            # predicts the next token; zero at the start, so a model gains it as the same function.
            hidden = config.text_config.hidden_size
            self.reading_copy = nn.Linear(hidden, hidden)
            self._init_reading_copy()
        if getattr(config, "mask_token_id", None) is None:
            # A hub GLM-OCR checkpoint has no mask id: use one past the vocabulary, which
            # never collides with a real token and is never looked up in the embedding table.
            config.mask_token_id = config.text_config.vocab_size
        self.mask_embedding = nn.Parameter(torch.empty(config.text_config.hidden_size))
        # The parent's post_init already ran (and marked this module initialised), so the
        # new parameter is initialised here; `_init_weights` covers loading a checkpoint
        # that lacks it (weights are then created on the meta device and filled later).
        self._init_mask_embedding()

    def _init_mask_embedding(self) -> None:
        with torch.no_grad():
            hf_init.normal_(self.mask_embedding, mean=0.0, std=self.config.text_config.initializer_range)

    def _init_reading_copy(self) -> None:
        with torch.no_grad():
            hf_init.zeros_(self.reading_copy.weight)
            hf_init.zeros_(self.reading_copy.bias)

    def _init_weights(self, module):
        super()._init_weights(module)
        if module is self:
            self._init_mask_embedding()
        if module is getattr(self, "reading_copy", None):
            self._init_reading_copy()
        strip_vision = getattr(self, "strip_vision", None)
        if strip_vision is not None and module is strip_vision.reading_projection:
            # a strip checkpoint saved before the reading hint loads as the same function
            hf_init.zeros_(module.weight)
        if strip_vision is not None and module is strip_vision:
            # likewise one saved before the reading marker
            hf_init.zeros_(module.reading_marker)
        if strip_vision is not None and module is getattr(strip_vision, "vertical_projection", None):
            hf_init.zeros_(module.weight)

    @property
    def reading_prefix(self):
        """The reading prefix's token ids (model/network/strip_vision.py), or None: no prefix."""
        from gravityocr.model.network.strip_vision import ReadingPrefix

        return ReadingPrefix.of(self.config)

    @property
    def ctc_prefix_weight(self) -> float:
        """Weight of the CTC prefix score in the greedy choice on one-strip text lines
        (config `ctc_prefix_weight`, model/decode/ctc_prefix.py); 0: plain argmax."""
        return float(getattr(self.config, "ctc_prefix_weight", 0.0) or 0.0)

    @property
    def copies_reading(self) -> bool:
        """Whether `embed` takes copy tokens (config `reading_copy`, a model with a reading prefix)."""
        return hasattr(self, "reading_copy")

    @property
    def mask_token_id(self) -> int:
        return int(self.config.mask_token_id)

    # --- the three primitives used by training and decoding -------------------------

    def encode_images(self, pixel_values: torch.Tensor, image_grid_thw: torch.Tensor,
                      readings: list | None = None, frames: list | None = None) -> list[torch.Tensor]:
        """Vision tower: one tensor of visual-token embeddings per image (for a strip model
        with a reading prefix, followed by the prefix's token embeddings). With `readings`
        (a list), a strip model with a reading prefix appends each image's reading to it
        (token ids, model/network/strip_vision.py). With `frames` (a list), a strip model
        appends per image its classifier's (frames, vocab + 1) log-probabilities, one frame
        per 8 px, for a one-strip image (None for a taller one): what joint decoding scores
        (model/decode/ctc_prefix.py)."""
        if hasattr(self, "strip_vision"):
            return self.embed_strip_features(self.strip_vision.token_features(pixel_values, image_grid_thw),
                                             image_grid_thw, readings, frames)
        output = self.model.get_image_features(pixel_values, image_grid_thw, return_dict=True)
        return list(output.pooler_output)

    def embed_strip_features(self, features: list[torch.Tensor], image_grid_thw: torch.Tensor,
                             readings: list | None = None, frames: list | None = None) -> list[torch.Tensor]:
        """The strip tower's token features (one tensor per image) -> what fills each image's
        placeholders: projected visual tokens, then the reading prefix (model/network/strip_vision.py).
        `readings`, `frames`: as in `encode_images`."""
        from gravityocr.model.network.strip_vision import MERGE

        prefix = self.reading_prefix
        out = []
        for features_of_image, (_, grid_h, grid_w) in zip(features, image_grid_thw.tolist()):
            logits = self.strip_vision.reading_logits(features_of_image)
            visual = self.strip_vision.project(features_of_image, logits)
            if frames is not None:
                one_strip = grid_h // MERGE == 1
                frames.append(logits.float().reshape(-1, logits.shape[-1]).log_softmax(-1) if one_strip else None)
            if prefix is not None:
                rows, columns = grid_h // MERGE, grid_w // MERGE
                read = self.strip_vision.reading(logits, rows, columns, prefix)
                if readings is not None:
                    readings.append(read)
                ids = self.strip_vision.reading_ids(read, rows, columns, prefix, logits.device)
                reading = self.get_input_embeddings()(ids) + self.strip_vision.reading_marker
                visual = torch.cat([visual, reading.to(visual.dtype)])
            out.append(visual)
        return out

    def embed(self, input_ids: torch.Tensor, image_embeds: torch.Tensor | None = None,
              copy_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Token embeddings with mask positions replaced by the mask embedding and image
        placeholders (and reading-prefix placeholders) replaced in order by `image_embeds`
        (what `encode_images` gives, all images concatenated). `copy_ids` (shaped as
        `input_ids`; NO_COPY where a position has none), for a model that `copies_reading`:
        each position's copy token (model/decode/reading_drafts.py), projected and added."""
        is_mask = input_ids == self.mask_token_id
        table = self.get_input_embeddings()
        embeds = table(input_ids.masked_fill(is_mask, 0))
        embeds = torch.where(is_mask[..., None], self.mask_embedding.to(embeds.dtype), embeds)
        if copy_ids is not None and self.copies_reading:
            has_copy = copy_ids >= 0
            copied = self.reading_copy(table(copy_ids.clamp(min=0)))
            embeds = embeds + torch.where(has_copy[..., None], copied, torch.zeros_like(copied)).to(embeds.dtype)
        if image_embeds is not None:
            is_image = input_ids == self.config.image_token_id
            prefix = self.reading_prefix
            if prefix is not None:
                is_image = is_image | (input_ids == prefix.placeholder_id)
            n_placeholders = int(is_image.sum())
            if n_placeholders != image_embeds.shape[0]:
                raise ValueError(
                    f"{n_placeholders} image placeholder tokens but {image_embeds.shape[0]} visual tokens"
                )
            embeds = embeds.masked_scatter(is_image[..., None], image_embeds.to(embeds.dtype))
        return embeds

    def logits_from_embeds(
        self,
        inputs_embeds: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        cache: Cache | None = None,
        copy_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Decoder + LM head under an explicit mask.

        position_ids: (3, batch, seq) rope positions; attention_mask: (batch, 1, seq, past+seq)
        bool, True = attend (sdpa semantics; the model is built with sdpa attention).
        `copy_ids`: the same as given to `embed` (see `output_logits`).
        """
        hidden = self.model.language_model(
            inputs_embeds=inputs_embeds,
            position_ids=position_ids,
            attention_mask=attention_mask,
            cache=cache,
            use_cache=cache is not None,
        ).last_hidden_state
        return self.output_logits(hidden, copy_ids)

    def output_logits(self, hidden: torch.Tensor, copy_ids: torch.Tensor | None = None) -> torch.Tensor:
        """LM head. A copying model with a copy bias (config `copy_logit_bias`) adds it to the
        logit of each position's copy token (`copy_ids` shaped as `hidden` without its last
        dimension; NO_COPY where a position has none): the reading is written unless the
        decoder's own preference beats it by that margin. Every path that commits tokens
        passes the copy tokens it gives `embed`, so greedy decoding stays one function."""
        logits = self.lm_head(hidden)
        bias = float(getattr(self.config, "copy_logit_bias", 0.0) or 0.0)
        if copy_ids is None or not bias or not self.copies_reading:
            return logits
        has_copy = (copy_ids >= 0).to(logits.dtype)[..., None]
        return logits.scatter_add(-1, copy_ids.clamp(min=0)[..., None], bias * has_copy)

    def rope_positions(self, input_ids: torch.Tensor, image_grid_thw: torch.Tensor | None) -> tuple[torch.Tensor, int]:
        """GLM-OCR's 3-D rope positions for one prompt (1, P), and the position the first
        response token takes. Text after the prompt advances all three axes together.

        Reading-prefix positions (model/network/strip_vision.py) are left out of that count: the
        prefix's k-th token takes the position of the k-th response token, so the token to
        copy next always sits one position past the one being predicted from, whatever
        the prompt's length (a fixed rope offset a head can follow; the prefix is still
        before the response in the attention order)."""
        prefix = self.reading_prefix
        if prefix is not None:
            is_reading = input_ids[0] == prefix.placeholder_id
            if bool(is_reading.any()):
                kept, first = self._rope_positions(input_ids[:, ~is_reading], image_grid_thw)
                positions = torch.empty(3, 1, input_ids.shape[1], dtype=kept.dtype, device=kept.device)
                positions[:, :, ~is_reading] = kept
                positions[:, :, is_reading] = first + torch.arange(int(is_reading.sum()), device=kept.device)
                return positions, first
        return self._rope_positions(input_ids, image_grid_thw)

    def _rope_positions(self, input_ids: torch.Tensor, image_grid_thw: torch.Tensor | None) -> tuple[torch.Tensor, int]:
        mm_token_type_ids = (input_ids == self.config.image_token_id).int()
        if image_grid_thw is None or not bool(mm_token_type_ids.any()):
            length = input_ids.shape[1]
            positions = torch.arange(length, device=input_ids.device).view(1, 1, -1).expand(3, 1, -1)
            return positions, length
        positions, _ = self.model.get_rope_index(input_ids, mm_token_type_ids, image_grid_thw=image_grid_thw)
        return positions, int(positions.max()) + 1

