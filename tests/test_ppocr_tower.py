"""The torch PP-OCRv6 recognizer against the real rapidocr ONNX model on onnxruntime.

Lines are rendered with matplotlib's DejaVu fonts; nothing is mocked. The whole module is
skipped where rapidocr, onnxruntime or onnx (conversion only) is not installed.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("rapidocr")
pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from gravityocr.bench.tower import main as bench_main  # noqa: E402
from gravityocr.bench.tower import render_line  # noqa: E402
from gravityocr.model.network.ppocr_conversion import (  # noqa: E402
    CHECKSUM_KEY,
    convert_onnx,
    file_sha256,
    rapidocr_model_path,
)
from gravityocr.model.network.ppocr_loading import load_ppocr_recognizer, read_metadata  # noqa: E402
from gravityocr.model.network.ppocr_preprocessing import preprocess, preprocess_batch  # noqa: E402
from gravityocr.model.network.ppocr_tower import PPOCRv6Recognizer, ctc_greedy_decode  # noqa: E402

TOLERANCE = 1e-4
LINES = [
    "Hello, world 42",
    "The quick brown fox jumps over the lazy dog 0123456789",
    "Pack my box with five dozen liquor jugs; then (a+b)*c = 17.5% of $300, said Dr. Smith at 09:45.",
]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    return convert_onnx(rapidocr_model_path(), tmp_path_factory.mktemp("ppocr") / "rec.safetensors")


@pytest.fixture(scope="module")
def recognizer(converted):
    return load_ppocr_recognizer(converted)


@pytest.fixture(scope="module")
def session():
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(rapidocr_model_path()), options, providers=["CPUExecutionProvider"])


def compare(recognizer, session, pixels: torch.Tensor) -> torch.Tensor:
    reference = session.run(None, {"x": pixels.numpy()})[0]
    with torch.inference_mode():
        probabilities = recognizer.probabilities(pixels)
    assert probabilities.shape == reference.shape
    assert np.abs(probabilities.numpy() - reference).max() < TOLERANCE
    assert np.array_equal(probabilities.argmax(-1).numpy(), reference.argmax(-1))
    return probabilities


@pytest.mark.parametrize("font", ["DejaVuSans.ttf", "DejaVuSerif.ttf"])
def test_matches_onnxruntime_line_by_line(recognizer, session, font):
    widths = set()
    for text in LINES:
        pixels = preprocess(render_line(text, font))[None]
        widths.add(pixels.shape[-1])
        compare(recognizer, session, pixels)
    assert len(widths) == len(LINES)  # 320 px (padded), ~1000 px, ~1650 px


def test_matches_onnxruntime_on_a_padded_batch(recognizer, session):
    images = [render_line(text, "DejaVuSansMono.ttf") for text in LINES] + [render_line("x")]
    pixels = preprocess_batch(images)
    assert pixels.shape[0] == 4 and (pixels[-1, :, :, 100:] == 0).all()  # the short line is padded
    probabilities = compare(recognizer, session, pixels)
    assert ctc_greedy_decode(probabilities, recognizer.characters)[:3] == LINES


def test_greedy_transcript_of_a_rendered_line_is_its_text(recognizer):
    text = "Sphinx of black quartz, judge my vow: 12 + 30 = 42."
    with torch.inference_mode():
        assert recognizer.read(preprocess(render_line(text, "DejaVuSerif.ttf"))[None]) == [text]


@pytest.mark.parametrize("width", [320, 960])
def test_feature_shapes(recognizer, width):
    with torch.inference_mode():
        output = recognizer(torch.zeros(2, 3, 48, width))
        assert output.feature_map.shape == (2, 384, 3, width // 4)
        assert output.sequence.shape == (2, width // 8, 120)
        assert recognizer.head(output.sequence).shape == (2, width // 8, 18710)
        # The backbone alone takes taller lines; the neck, like the ONNX graph, does not.
        assert recognizer.features(torch.zeros(1, 3, 96, width)).shape == (1, 384, 6, width // 4)
        with pytest.raises(ValueError, match="pooled height of 1"):
            recognizer(torch.zeros(1, 3, 96, width))


def test_converted_file_loads_strictly_and_records_the_checksum(converted, recognizer):
    source = rapidocr_model_path()
    assert read_metadata(converted)[CHECKSUM_KEY] == file_sha256(source)
    characters = recognizer.characters
    assert len(characters) == 18710 and characters[0] == "blank" and characters[-1] == " "
    assert characters[1:4] == ["!", '"', "#"]
    state = dict(recognizer.state_dict())
    state.pop("neck.norm.bias")
    with pytest.raises(RuntimeError, match="Missing key"):
        PPOCRv6Recognizer().load_state_dict(state, strict=True)


def test_preprocess_is_rapidocrs(tmp_path):
    from rapidocr.ch_ppocr_rec.main import TextRecognizer
    from rapidocr.utils.load_image import LoadImage

    rapid = SimpleNamespace(rec_image_shape=[3, 48, 320])
    images = [render_line(LINES[1]), render_line("x").convert("L"), render_line("ab", size=60)]
    ratio = max(320 / 48, *(image.width / image.height for image in images))
    batch = preprocess_batch(images)
    for image, ours in zip(images, batch):
        path = tmp_path / "line.png"
        image.save(path)  # rapidocr reads a file path as BGR through its own loader
        bgr = LoadImage()(str(path))
        theirs = TextRecognizer.resize_norm_img(rapid, bgr, ratio)
        assert np.array_equal(ours.numpy(), theirs)
        single = preprocess(image)
        alone = TextRecognizer.resize_norm_img(rapid, bgr, max(320 / 48, image.width / image.height))
        assert np.array_equal(single.numpy(), alone)


def test_chunked_batch_and_blocked_head_give_the_whole_batchs_numbers(recognizer):
    pixels = preprocess_batch([render_line(text) for text in LINES[:2]])
    whole = PPOCRv6Recognizer(chunk_bytes=1 << 40)
    whole.load_state_dict(recognizer.state_dict())
    line_by_line = PPOCRv6Recognizer(chunk_bytes=1)  # one line per chunk, one step per head block
    line_by_line.load_state_dict(recognizer.state_dict())
    with torch.inference_mode():
        expected = whole.eval()(pixels)
        got = line_by_line.eval()(pixels)
        for ours, theirs in ((got.feature_map, expected.feature_map), (got.sequence, expected.sequence)):
            # float rounding only (matmul blocking differs with the batch size); a line mixed up
            # with another, or cut, would be off by the features' own scale
            assert (ours - theirs).abs().max() <= 1e-4 * theirs.abs().max()
        blocked = line_by_line.head(expected.sequence)
    plain = whole.head(expected.sequence.clone())  # autograd on: one plain linear + softmax
    assert plain.requires_grad
    torch.testing.assert_close(blocked, plain.detach(), rtol=0, atol=1e-5)


def test_bench_reports_both_engines(converted, capsys):
    assert bench_main(["--count", "2", "--batch", "2", "--threads", "1", "--rounds", "1",
                       "--weights", str(converted), "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [row["batch"] for row in report["rows"]] == ["1", "2"]
    assert all(row["onnxruntime"] > 0 and row["torch"] > 0 for row in report["rows"])
    assert report["same_argmax"] and report["max_abs_diff"] < TOLERANCE
