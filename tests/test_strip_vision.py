"""The PP-OCRv6 strip tower as a vision tower option: one crop normalisation whatever the
crop's scale and margins, the cells the engine batches rebuild the strips exactly, the
model saves and loads with its processor, and every decoding path stays exact with it."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw, ImageFont

from gravityocr.model.network.configs import build_config
from gravityocr.model.decode.reference import greedy_decode, speculative_decode
from gravityocr.model.engine import Engine, EngineConfig, Request
from gravityocr.model.network.loading import Recognizer, load_recognizer, save_recognizer
from gravityocr.model.network.modeling import STRIP_TOWER, GravityOcrForConditionalGeneration, vision_tower_of
from gravityocr.model.network.processor import OcrProcessor
from gravityocr.model.network.strip_vision import (CELL_WIDTH, IMAGE_HEIGHT, ReadingPrefix, StripImageProcessor, cells_to_strips, evened,
                                           reading_slots)

from conftest import SEPARATED_INIT

TEXT = "Self-speculative decoding reads 42 lines."


def _font(size: int):
    import matplotlib

    return ImageFont.truetype(f"{matplotlib.get_data_path()}/fonts/ttf/DejaVuSerif.ttf", size)


def render(lines: list[str], size: int, margin: int) -> Image.Image:
    font = _font(size)
    width = max(int(font.getlength(line)) for line in lines) + 2 * margin
    height = int(len(lines) * size * 1.3) + 2 * margin
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    for number, line in enumerate(lines):
        draw.text((margin, margin + number * size * 1.3), line, fill="black", font=font)
    return image


def test_one_line_reads_the_same_at_any_scale_and_margin():
    processor = StripImageProcessor()
    shapes = set()
    for size in (14, 28, 56):
        for margin in (size // 8, size):
            strips = processor.strips(render([TEXT], size, margin))
            assert strips.shape[0] == 1 and strips.shape[2] == IMAGE_HEIGHT
            # the text spans about the same width whatever the scale: glyph heights measured
            # in whole pixels make a 14-px font's scale uncertain by about a pixel in ten
            ink = (strips[0].mean(dim=0) < 0).any(dim=0).nonzero()
            shapes.add(int(ink[-1] - ink[0]))
    assert max(shapes) / min(shapes) < 1.15


def test_a_faint_line_is_one_strip_centred_on_its_grey_ink():
    """A scan's faint line (no pixel darker than mid-grey) is found by its own paper/ink
    threshold: one strip, its ink placed as the same line's in black ink."""
    processor = StripImageProcessor()
    black = render([TEXT], 28, 12)
    faint = Image.fromarray((150 + np.asarray(black.convert("L")).astype(np.float32) * (90 / 255)).astype(np.uint8))
    assert np.asarray(faint).min() >= 140
    strips = {name: processor.strips(image) for name, image in (("black", black), ("faint", faint))}
    assert strips["black"].shape[0] == 1 and strips["faint"].shape == strips["black"].shape
    ink_rows = lambda strip: (strip.mean(dim=0) < strip.mean(dim=0).amax() - 0.1).any(dim=1).nonzero()[:, 0]
    assert abs(int(ink_rows(strips["faint"][0])[0]) - int(ink_rows(strips["black"][0])[0])) <= 1
    assert abs(int(ink_rows(strips["faint"][0])[-1]) - int(ink_rows(strips["black"][0])[-1])) <= 1


def test_a_photographed_line_finds_its_ink_on_its_own_paper():
    """Under one lamp (paper from 200 down to 80 across the crop, ink at 45% contrast) the
    line is still one strip, scaled and placed as the same line in black on white; a crop on
    white, even paper is measured as it is (the same array)."""
    processor = StripImageProcessor()
    black = render([TEXT], 28, 12)
    ink = 1.0 - np.asarray(black.convert("L")).astype(np.float32) / 255.0
    paper = np.linspace(200, 80, ink.shape[1], dtype=np.float32)[None, :].repeat(ink.shape[0], axis=0)
    photo = Image.fromarray((paper * (1.0 - 0.45 * ink)).astype(np.uint8)).convert("RGB")
    gray = lambda image: np.asarray(image.convert("L"))
    assert processor.scale_for(evened(gray(photo))) == pytest.approx(processor.scale_for(gray(black)), rel=0.05)
    strips = {name: processor.strips(image) for name, image in (("black", black), ("photo", photo))}
    assert strips["photo"].shape == strips["black"].shape and strips["black"].shape[0] == 1
    ink_rows = lambda strip: (strip.mean(dim=0) < strip.mean(dim=0).amax() - 0.3).any(dim=1).nonzero()[:, 0]
    assert abs(int(ink_rows(strips["photo"][0])[0]) - int(ink_rows(strips["black"][0])[0])) <= 2
    assert abs(int(ink_rows(strips["photo"][0])[-1]) - int(ink_rows(strips["black"][0])[-1])) <= 2
    clean = gray(black)
    assert evened(clean) is clean


def test_a_dot_leader_line_is_scaled_by_its_letters_not_its_dots():
    """A table-of-contents line is mostly dots: its scale is its letters', so it stays one
    strip at the size of the same words without the leader."""
    processor = StripImageProcessor()
    leader = render(["closure_get_data " + ". " * 30 + "5"], 28, 4)
    words = render(["closure_get_data 5"], 28, 4)
    gray = lambda image: np.asarray(image.convert("L"))
    assert processor.scale_for(gray(leader)) == pytest.approx(processor.scale_for(gray(words)), rel=0.1)
    assert processor.strips(leader).shape[0] == 1
    plain = render([TEXT], 28, 4)  # a line of words keeps the median of all its components
    assert processor.scale_for(gray(plain)) == pytest.approx(_median_glyph_scale(processor, gray(plain)))


def _median_glyph_scale(processor: StripImageProcessor, gray) -> float:
    import cv2

    _, ink = cv2.threshold(gray, 0, 1, cv2.THRESH_BINARY_INV + cv2.THRESH_OTSU)
    _, _, stats, _ = cv2.connectedComponentsWithStats(ink, connectivity=8)
    heights, areas = stats[1:, cv2.CC_STAT_HEIGHT], stats[1:, cv2.CC_STAT_AREA]
    return processor.glyph_height / float(np.median(heights[(areas >= 6) & (heights >= 3)]))


def test_tall_crops_become_overlapping_strips_and_cells_rebuild_them():
    processor = StripImageProcessor()
    image = render(["first line of a paragraph", "second line", "third and last line"], 24, 6)
    strips = processor.strips(image)
    assert strips.shape[0] >= 3
    features = processor(images=[image, render([TEXT], 20, 4)])
    grids = features["image_grid_thw"].tolist()
    rows, columns = grids[0][1] // 2, grids[0][2] // 2
    assert grids[0][0] == 1 and rows == strips.shape[0] and columns * CELL_WIDTH == strips.shape[3]
    assert features["pixel_values"].shape == (rows * columns + grids[1][1] * grids[1][2] // 4,
                                              3 * IMAGE_HEIGHT * CELL_WIDTH)
    assert torch.equal(cells_to_strips(features["pixel_values"][:rows * columns], rows, columns), strips)


@pytest.fixture(scope="module")
def strip_recognizer(tokenizer):
    torch.manual_seed(0)
    config = build_config(tokenizer, SEPARATED_INIT)
    config.vision_tower = STRIP_TOWER
    prefix = ReadingPrefix.for_tokenizer(tokenizer)
    config.reading_prefix = asdict(prefix)
    model = GravityOcrForConditionalGeneration(config).to(torch.float64).eval()
    with torch.no_grad():  # a trained marker, so every path below carries it
        model.strip_vision.reading_marker.normal_(std=0.5)
    return Recognizer(model, OcrProcessor(tokenizer, StripImageProcessor(), reading_placeholder_id=prefix.placeholder_id))


@pytest.fixture(scope="module")
def copying_recognizer(tokenizer):
    """A strip model with the copy path (config `reading_copy`), its projection trained
    (random). Its classifier "reads" what the model itself tends to write, then TEXT (the
    random tower's own reading is one character long): so the text's place is found in the
    reading at most positions, the copy tokens vary, and they change what the model writes."""
    torch.manual_seed(1)
    config = build_config(tokenizer, SEPARATED_INIT)
    config.vision_tower = STRIP_TOWER
    prefix = ReadingPrefix.for_tokenizer(tokenizer)
    config.reading_prefix = asdict(prefix)
    config.reading_copy = True
    model = GravityOcrForConditionalGeneration(config).to(torch.float64).eval()
    processor = OcrProcessor(tokenizer, StripImageProcessor(), reading_placeholder_id=prefix.placeholder_id)
    eos = set(processor.eos_token_ids)
    read = tokenizer.encode(TEXT, add_special_tokens=False)
    model.strip_vision.reading = lambda logits, rows, columns, _: read[:reading_slots(rows, columns)]
    with torch.no_grad():
        model.strip_vision.reading_marker.normal_(std=0.5)
        for n in (8, 41):  # the copy projection still zero: what the model writes without it
            written = greedy_decode(model, processor.encode(render([TEXT[:n]], 20, 3), "text"), 24, eos).token_ids
            read[:0] = [token for token in written if token not in eos]
        model.reading_copy.weight.normal_(std=0.5)
    return Recognizer(model, processor)


@pytest.fixture(scope="module")
def biased_recognizer(copying_recognizer):
    """The copying model with a copy bias (config `copy_logit_bias`): each position's copy
    token gets that much added to its logit."""
    import copy

    model = copy.deepcopy(copying_recognizer.model)
    model.config.copy_logit_bias = 3.0
    return Recognizer(model, copying_recognizer.processor)


@pytest.fixture(scope="module")
def joint_recognizer(copying_recognizer):
    """The copying model decoding one-strip lines jointly with its classifier's CTC prefix
    scores (config `ctc_prefix_weight`, model/decode/ctc_prefix.py), its classifier made
    confident (random weights of a larger scale), so the CTC term changes what it writes."""
    import copy

    model = copy.deepcopy(copying_recognizer.model)
    model.config.ctc_prefix_weight = 2.0
    torch.manual_seed(3)
    with torch.no_grad():
        model.strip_vision.reading_head.weight.normal_(std=1.0)
    return Recognizer(model, copying_recognizer.processor)


def test_the_model_saves_and_loads_with_its_tower_and_processor(strip_recognizer, tmp_path):
    model = strip_recognizer.model
    assert vision_tower_of(model.config) == STRIP_TOWER and not hasattr(model.model, "visual")
    save_recognizer(strip_recognizer, tmp_path / "strips")
    loaded = load_recognizer(tmp_path / "strips", dtype=torch.float64)
    assert isinstance(loaded.processor.image_processor, StripImageProcessor)
    prompt = loaded.processor.encode(render([TEXT], 20, 4), "text")
    with torch.no_grad():
        before = model.encode_images(prompt.pixel_values, prompt.image_grid_thw)[0]
        after = loaded.model.encode_images(prompt.pixel_values, prompt.image_grid_thw)[0]
    _, height, width = prompt.image_grid_thw[0].tolist()
    visual, slots = height * width // 4, reading_slots(height // 2, width // 2)
    assert before.shape == (visual + slots, model.config.text_config.hidden_size)
    assert int((prompt.input_ids == loaded.processor.reading_placeholder_id).sum()) == slots
    assert torch.equal(before, after)


def test_the_reading_prefix_is_its_tokens_embeddings_plus_the_marker(strip_recognizer, tmp_path):
    """Prefix positions hold the read tokens' embeddings plus the one learned marker; a model
    saved before the marker existed loads with it at zero, the function it was saved as."""
    from safetensors.torch import load_file, save_file

    model, processor = strip_recognizer.model, strip_recognizer.processor
    prompt = processor.encode(render([TEXT], 20, 4), "text")
    _, height, width = prompt.image_grid_thw[0].tolist()
    with torch.no_grad():
        filled = model.encode_images(prompt.pixel_values, prompt.image_grid_thw)[0]
        features = model.strip_vision.token_features(prompt.pixel_values, prompt.image_grid_thw)[0]
        read = model.strip_vision.reading(model.strip_vision.reading_logits(features), height // 2, width // 2,
                                          model.reading_prefix)
        ids = model.strip_vision.reading_ids(read, height // 2, width // 2, model.reading_prefix, features.device)
        expected = model.get_input_embeddings()(ids) + model.strip_vision.reading_marker
    assert torch.equal(filled[height * width // 4:], expected)
    assert model.strip_vision.reading_marker.abs().sum() > 0

    save_recognizer(strip_recognizer, tmp_path / "saved")
    weights = tmp_path / "saved" / "model.safetensors"
    save_file({k: v for k, v in load_file(weights).items() if k != "strip_vision.reading_marker"}, weights,
              metadata={"format": "pt"})
    loaded = load_recognizer(tmp_path / "saved", dtype=torch.float64)
    assert torch.equal(loaded.model.strip_vision.reading_marker, torch.zeros_like(model.strip_vision.reading_marker))


def test_the_reading_prefix_takes_the_positions_of_the_response(strip_recognizer):
    """The k-th reading token sits at the k-th response token's rope position; the rest of
    the prompt keeps the positions it has without the prefix."""
    model, processor = strip_recognizer.model, strip_recognizer.processor
    prompt = processor.encode(render([TEXT], 20, 4), "text")
    is_reading = prompt.input_ids[0] == processor.reading_placeholder_id
    positions, first = model.rope_positions(prompt.input_ids, prompt.image_grid_thw)
    without, first_without = model.rope_positions(prompt.input_ids[:, ~is_reading], prompt.image_grid_thw)
    assert first == first_without
    assert torch.equal(positions[:, :, ~is_reading], without)
    expected = first + torch.arange(int(is_reading.sum()))
    assert all(torch.equal(positions[axis, 0, is_reading], expected) for axis in range(3))


def test_the_reading_prefix_holds_what_the_pretrained_classifier_reads(tokenizer, tmp_path):
    """With the pretrained weights, a clean line's reading prefix is its text, and a
    two-line crop's is both lines (one per strip, overlapping strips read them again)
    joined by newlines, then empty positions up to the slot count."""
    from gravityocr.model.network.ppocr_conversion import convert_onnx, rapidocr_model_path
    from gravityocr.model.training.strip_start import start_model

    start = tmp_path / "start"
    config = build_config(tokenizer, SEPARATED_INIT)
    save_recognizer(Recognizer(GravityOcrForConditionalGeneration(config), OcrProcessor(tokenizer, StripImageProcessor())), start)
    tower = convert_onnx(rapidocr_model_path(), tmp_path / "tower.safetensors")
    recognizer = start_model(start, tower, reading_prefix=True)
    model, processor = recognizer.model, recognizer.processor
    prefix = ReadingPrefix.of(model.config)
    for lines in ([TEXT], ["Whole pages", "a reader trusts"]):
        prompt = processor.encode(render(lines, 22, 6), "text")
        _, height, width = prompt.image_grid_thw[0].tolist()
        with torch.no_grad():
            features = model.strip_vision.token_features(prompt.pixel_values, prompt.image_grid_thw)[0]
            reading = model.strip_vision.reading(model.strip_vision.reading_logits(features), height // 2,
                                                 width // 2, prefix)
            ids = model.strip_vision.reading_ids(reading, height // 2, width // 2, prefix, features.device).tolist()
            readings = []
            model.encode_images(prompt.pixel_values, prompt.image_grid_thw, readings)
        assert readings == [reading]  # what the engine drafts from (model/decode/reading_drafts.py)
        assert len(ids) == reading_slots(height // 2, width // 2) == int((prompt.input_ids == prefix.placeholder_id).sum())
        read = [i for i in ids if i != prefix.empty_id]
        assert ids[len(read):] == [prefix.empty_id] * (len(ids) - len(read))
        strips = processor.decode(read).split("\n")
        assert len(strips) == height // 2
        assert all(line in strips for line in lines), strips


def test_an_unknown_vision_tower_is_refused(tokenizer):
    config = build_config(tokenizer, SEPARATED_INIT)
    config.vision_tower = "vit-xl"
    with pytest.raises(ValueError, match="unknown vision_tower 'vit-xl'"):
        GravityOcrForConditionalGeneration(config)


@pytest.mark.parametrize("recognizer_name",
                         ["strip_recognizer", "copying_recognizer", "biased_recognizer", "joint_recognizer"])
def test_every_decoding_path_is_exact_with_the_strip_tower(recognizer_name, request):
    recognizer = request.getfixturevalue(recognizer_name)
    model, processor = recognizer.model, recognizer.processor
    eos = set(processor.eos_token_ids)
    images = [render([TEXT[:n]], 18 + n % 5, 3) for n in (8, 20, 41)]
    images.append(render(["a two-line", "crop"], 20, 5))
    # text lines draft from the reading, a formula beside them takes AR steps (mask drafts
    # for every row without reading drafts)
    prompts = [processor.encode(image, "text") for image in images] + [processor.encode(images[1], "formula")]
    with torch.no_grad():
        greedy = [greedy_decode(model, prompt, 24, eos).token_ids for prompt in prompts]
        references = {reading: [speculative_decode(model, prompt, 24, eos, 8, reading_drafts=reading)
                                for prompt in prompts] for reading in (True, False)}
    for reading, decoded in references.items():
        assert [r.token_ids for r in decoded] == greedy
        for prompt, result in zip(prompts, decoded):
            expected_sources = ({"reading"} if prompt.task == "text" else set()) if reading else {"mask"}
            assert set(result.stats.drafted_tokens) <= expected_sources
    longest = max(p.length for p in prompts) + 24
    # the engine's rounds are the reference's, round for round, under fixed blocks: drafts
    # chosen by content, rows of both kinds in one batch
    for reading in (True, False):
        engine = Engine(model, EngineConfig(max_batch_size=5, max_seq_len=longest, block_size=8, dtype=torch.float64,
                                            num_threads=1, adaptive_block=False, reading_drafts=reading), eos)
        results = engine.generate([Request(str(i), prompt, 24) for i, prompt in enumerate(prompts)])
        for result, reference in zip(results, references[reading]):
            assert result.token_ids == reference.token_ids
            assert result.stats.accepted_per_round == reference.stats.accepted_per_round
            assert result.stats.forward_passes == reference.stats.forward_passes
            assert result.stats.drafted_tokens == reference.stats.drafted_tokens
    # batch 4: speculating at every batch size, and past a cap of 1 (AR rounds above it);
    # drafts from the reading prefix (the default for such a model) and from masks
    for cap, reading in ((0, True), (1, True), (0, False)):
        engine = Engine(model, EngineConfig(max_batch_size=4, max_seq_len=longest, block_size=8, mode="spec",
                                            dtype=torch.float64, num_threads=1, speculative_max_batch=cap or None,
                                            reading_drafts=reading), eos)
        results = {r.request_id: r.token_ids for r in engine.generate(
            [Request(str(i), prompt, 24) for i, prompt in enumerate(prompts)])}
        assert [results[str(i)] for i in range(len(prompts))] == greedy
    # AR rounds all the way (mode "ar")
    engine = Engine(model, EngineConfig(max_batch_size=4, max_seq_len=longest, mode="ar", dtype=torch.float64,
                                        num_threads=1), eos)
    results = {r.request_id: r.token_ids for r in engine.generate(
        [Request(str(i), prompt, 24) for i, prompt in enumerate(prompts)])}
    assert [results[str(i)] for i in range(len(prompts))] == greedy


def test_the_copy_path_feeds_training_what_decoding_feeds(copying_recognizer):
    """Teacher-forced on its own greedy output, the joint batch's clean stream gives the same
    logits as greedy decoding step by step: the copy tokens of training are decoding's. And
    they matter: the same model without them reads otherwise (and so does greedy decoding)."""
    from transformers.cache_utils import DynamicCache

    from gravityocr.model.decode.reading_drafts import NO_COPY, ReadingIndex, reading_with_eos
    from gravityocr.model.decode.reference import prefill
    from gravityocr.model.training.joint_loss import Objective, TrainingSample, build_joint_batch, joint_logits

    model, processor = copying_recognizer.model, copying_recognizer.processor
    eos = set(processor.eos_token_ids)
    prompt = processor.encode(render([TEXT[:20]], 20, 3), "text")
    with torch.no_grad():
        greedy = greedy_decode(model, prompt, 16, eos).token_ids
        readings: list = []
        model.encode_images(prompt.pixel_values, prompt.image_grid_thw, readings)
        reading = reading_with_eos(readings[0], frozenset(eos))
        batch = build_joint_batch(model, [TrainingSample(prompt, greedy, reading)], Objective.AR_ONLY,
                                  random_block_offset=False)
        logits = joint_logits(model, batch)[0]
        start = prefill(model, prompt, DynamicCache(config=model.config.text_config), eos)
    P = prompt.length
    copies = batch.copy_ids[0, P - 1:P - 1 + len(greedy)].tolist()
    assert copies == ReadingIndex(reading).copy_tokens(greedy[:-1])
    assert sum(c != NO_COPY for c in copies) >= len(copies) // 3  # the place is found along the text
    assert logits[P - 1:P - 1 + len(greedy)].argmax(-1).tolist() == greedy
    torch.testing.assert_close(logits[P - 1], start.logits)
    with torch.no_grad():
        weight = model.reading_copy.weight.clone()
        model.reading_copy.weight.zero_()
        model.reading_copy.bias.zero_()
        try:
            without = joint_logits(model, batch)[0]
        finally:
            model.reading_copy.weight.copy_(weight)
    assert not torch.allclose(without[P - 1:P - 1 + len(greedy)], logits[P - 1:P - 1 + len(greedy)])
    assert without[P - 1:P - 1 + len(greedy)].argmax(-1).tolist() != greedy


def test_the_output_budget_holds_every_real_item_and_bounds_a_short_line(strip_recognizer):
    """The budget a crop's size allows (OcrProcessor.output_budget) is never shorter than the
    true text of the committed real-document items, and a short word gets a short budget."""
    from gravityocr.model.evaluation.manifest import read_manifest

    processor = strip_recognizer.processor
    items = read_manifest(Path(__file__).parents[1] / "data" / "real")
    assert len(items) > 400
    for item in items:
        if item.type == "page":
            continue
        prompt = processor.encode(item.load_image(), item.type)
        needed = len(processor.tokenizer.encode(item.text, add_special_tokens=False)) + 1
        assert processor.output_budget(prompt) >= needed, item.id
    word = Image.new("RGB", (120, 40), "white")
    ImageDraw.Draw(word).text((8, 10), "word", fill="black")
    assert processor.output_budget(processor.encode(word, "text")) <= 150
    # a cell cut out of a row ("x = 1"): what the crop fills bounds it, not the padding of
    # its strip to a line's width
    prompt = processor.encode(render(["x = 1"], 20, 3), "text")
    padded = int(prompt.image_grid_thw[0, 2]) // 2
    assert prompt.content_columns < padded
    assert processor.output_budget(prompt) <= 8 * prompt.content_columns + 16 < 8 * padded + 16


def test_grpo_rollouts_of_a_copying_model_feed_each_member_its_copy_tokens(copying_recognizer):
    """Sampled nearly greedily, every member of a group writes the greedy text: each step gave
    it the copy token of its own text, as greedy decoding does."""
    from gravityocr.model.training.rollouts import sample_group

    model, processor = copying_recognizer.model, copying_recognizer.processor
    eos = set(processor.eos_token_ids)
    prompt = processor.encode(render([TEXT[:20]], 20, 3), "text")
    with torch.no_grad():
        greedy = greedy_decode(model, prompt, 16, eos).token_ids
    group = sample_group(model, prompt, 2, 16, eos, temperature=1e-4, generator=torch.Generator().manual_seed(0))
    assert group == [greedy, greedy]



def test_the_copy_bias_is_in_training_and_every_decoding_path_and_changes_the_reading(biased_recognizer,
                                                                                       copying_recognizer):
    """Teacher-forced on its own greedy output, the biased model's clean stream gives the
    logits greedy decoding gives step by step (the bias included: each is the unbiased
    model's plus the bias on the copy token), and the bias changes what greedy writes."""
    from transformers.cache_utils import DynamicCache

    from gravityocr.model.decode.reading_drafts import reading_with_eos
    from gravityocr.model.decode.reference import prefill
    from gravityocr.model.training.joint_loss import Objective, TrainingSample, build_joint_batch, joint_logits

    model, processor = biased_recognizer.model, biased_recognizer.processor
    eos = set(processor.eos_token_ids)
    prompts = [processor.encode(render([TEXT[:n]], 20, 3), "text") for n in (8, 20, 41)]
    with torch.no_grad():
        biased = [greedy_decode(model, prompt, 16, eos).token_ids for prompt in prompts]
        plain = [greedy_decode(copying_recognizer.model, prompt, 16, eos).token_ids for prompt in prompts]
        assert biased != plain
        prompt, greedy = prompts[1], biased[1]
        readings: list = []
        model.encode_images(prompt.pixel_values, prompt.image_grid_thw, readings)
        sample = TrainingSample(prompt, greedy, reading_with_eos(readings[0], frozenset(eos)))
        batch = build_joint_batch(model, [sample], Objective.AR_ONLY, random_block_offset=False)
        logits = joint_logits(model, batch)[0]
        unbiased = joint_logits(copying_recognizer.model, batch)[0]
        start = prefill(model, prompt, DynamicCache(config=model.config.text_config), eos)
    P = prompt.length
    assert logits[P - 1:P - 1 + len(greedy)].argmax(-1).tolist() == greedy
    torch.testing.assert_close(logits[P - 1], start.logits)
    copies = batch.copy_ids[0]
    expected = unbiased.clone()
    rows = torch.nonzero(copies >= 0)[:, 0]
    expected[rows, copies[rows]] += 3.0
    torch.testing.assert_close(logits, expected)


def test_joint_decoding_scores_one_strip_lines_only_and_changes_what_greedy_writes(joint_recognizer,
                                                                                    copying_recognizer):
    """A one-strip text line is decoded jointly (its scorer's choice, not the argmax), a
    two-strip crop and a table by plain argmax; the CTC term changes what greedy writes."""
    from transformers.cache_utils import DynamicCache

    from gravityocr.model.decode.reference import prefill

    model, processor = joint_recognizer.model, joint_recognizer.processor
    eos = set(processor.eos_token_ids)
    line = processor.encode(render([TEXT[:20]], 20, 3), "text")
    two_lines = processor.encode(render(["a two-line", "crop"], 20, 5), "text")
    table = processor.encode(render([TEXT[:20]], 20, 3), "table")
    with torch.no_grad():
        starts = {name: prefill(model, prompt, DynamicCache(config=model.config.text_config), eos)
                  for name, prompt in (("line", line), ("two_lines", two_lines), ("table", table))}
        assert starts["line"].scorer is not None and starts["line"].scorer.weight == 2.0
        assert starts["two_lines"].scorer is None and starts["table"].scorer is None
        prompts = [processor.encode(render([TEXT[:n]], 20, 3), "text") for n in (8, 20, 41)]
        joint = [greedy_decode(model, prompt, 16, eos).token_ids for prompt in prompts]
        plain = [greedy_decode(copying_recognizer.model, prompt, 16, eos).token_ids for prompt in prompts]
        assert joint != plain
        # a two-strip crop reads as the model without the CTC term reads it
        assert greedy_decode(model, two_lines, 16, eos).token_ids == \
            greedy_decode(copying_recognizer.model, two_lines, 16, eos).token_ids


def test_vertical_detail_tells_a_superscript_from_a_subscript_and_starts_as_the_same_function(strip_recognizer,
                                                                                                tmp_path):
    """With vertical detail (config `strip_vertical_detail`) a token's features also hold the
    backbone map's top and bottom rows less their mean: an `x` set high and one set low give
    the same averaged features' shape but other detail. Its projection starts at zero, so the
    model gives the embeddings it gave without it; saved and loaded, it keeps the detail."""
    import copy

    from gravityocr.model.network.strip_vision import FEATURES_PER_TOKEN, VERTICAL_PER_TOKEN

    config = copy.deepcopy(strip_recognizer.model.config)
    config.strip_vertical_detail = True
    torch.manual_seed(0)
    detailed = GravityOcrForConditionalGeneration(config).to(torch.float64).eval()
    detailed.load_state_dict(strip_recognizer.model.state_dict(), strict=False)
    assert detailed.strip_vision.vertical_detail and not strip_recognizer.model.strip_vision.vertical_detail
    processor = strip_recognizer.processor

    def drawn(offset: int) -> Image.Image:
        image = Image.new("RGB", (200, 40), "white")
        font = _font(14)
        ImageDraw.Draw(image).text((20, 10), "a", font=font, fill="black")
        ImageDraw.Draw(image).text((40, 10 + offset), "x", font=font, fill="black")
        return image

    with torch.no_grad():
        features = []
        for offset in (-6, 6):
            prompt = processor.encode(drawn(offset), "formula")
            [f] = detailed.strip_vision.token_features(prompt.pixel_values, prompt.image_grid_thw)
            assert f.shape[1] == FEATURES_PER_TOKEN + VERTICAL_PER_TOKEN
            features.append(f)
            plain = strip_recognizer.model.encode_images(prompt.pixel_values, prompt.image_grid_thw)[0]
            assert torch.allclose(detailed.encode_images(prompt.pixel_values, prompt.image_grid_thw)[0], plain)
    high, low = features
    assert high.shape == low.shape
    # the map's rows part more between the two than the height-averaged features do
    detail_gap = (high[:, FEATURES_PER_TOKEN:] - low[:, FEATURES_PER_TOKEN:]).abs().mean()
    assert detail_gap > (high[:, :FEATURES_PER_TOKEN] - low[:, :FEATURES_PER_TOKEN]).abs().mean()
    with torch.no_grad():
        detailed.strip_vision.vertical_projection.weight.normal_(std=0.1)
    save_recognizer(Recognizer(detailed, processor), tmp_path / "detailed")
    loaded = load_recognizer(tmp_path / "detailed", dtype=torch.float64)
    assert loaded.model.strip_vision.vertical_detail
    assert torch.equal(loaded.model.strip_vision.vertical_projection.weight, detailed.strip_vision.vertical_projection.weight)
