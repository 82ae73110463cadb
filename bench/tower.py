"""`gravityocr bench tower`: the torch PP-OCRv6 recognizer (model/network/ppocr_tower.py) against
onnxruntime running rapidocr's ONNX file, on the same rendered text lines.

Lines of 40–90 characters are rendered 48 px high in DejaVu fonts (seeded). Milliseconds per
line: at batch 1 (each line alone at its own width) and in batches (all lines of a batch
padded to its widest, as rapidocr pads), for each thread count; torch to the CTC
probabilities (the ONNX model's output) and to the 120-d sequence (the tower alone). Each
figure is the median over rounds of wall time, with process CPU time (all threads)
beside it: on a shared machine the CPU time of one thread is the steadier figure.
The largest probability difference between the two engines on these lines is printed too.
Prints figures; never judges them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont

from gravityocr.model.network.ppocr_conversion import convert_onnx, rapidocr_model_path
from gravityocr.model.network.ppocr_loading import load_ppocr_recognizer
from gravityocr.model.network.ppocr_preprocessing import preprocess, preprocess_batch

FONTS = ("DejaVuSans.ttf", "DejaVuSerif.ttf", "DejaVuSansMono.ttf")
WORDS = ("the of and to in is that for it with as was on be by this are from at or an which have not were "
         "can has all their one more other been these also two into may some time would such only first over "
         "most new any value table figure section page line (see) [1] 2.5 42% x=3 $10 e.g. i.e., data: model; "
         "OCR input output results method").split()


def font_path(name: str) -> str:
    import matplotlib

    return os.path.join(os.path.dirname(matplotlib.__file__), "mpl-data", "fonts", "ttf", name)


def render_line(text: str, font: str = "DejaVuSans.ttf", size: int = 28, height: int | None = None) -> Image.Image:
    """Black text on white: tight around the ink with a small margin, or `height` px high
    with the ink centred vertically."""
    face = ImageFont.truetype(font_path(font), size)
    left, top, right, bottom = face.getbbox(text)
    canvas_height = height or bottom - top + 12
    image = Image.new("RGB", (right - left + 16, canvas_height), "white")
    y = (canvas_height - (bottom - top)) // 2 - top
    ImageDraw.Draw(image).text((8 - left, y), text, fill="black", font=face)
    return image


def make_lines(count: int, seed: int = 0) -> list[tuple[str, Image.Image]]:
    rng = random.Random(seed)
    lines = []
    for index in range(count):
        target = rng.randint(40, 90)
        words: list[str] = []
        while len(" ".join(words)) < target:
            words.append(rng.choice(WORDS))
        text = " ".join(words)[:target].strip()
        lines.append((text, render_line(text, FONTS[index % len(FONTS)], size=30, height=48)))
    return lines


def measure(runners: dict[str, Callable[[], object]], rounds: int) -> dict[str, tuple[float, float]]:
    """Median wall and process-CPU milliseconds of each runner, one runner at a time after a
    warm-up run: onnxruntime's pool threads spin for a while after each run, and torch's
    OpenMP threads run slowly beside them, so alternating the two runners run by run would
    time that interference rather than either engine."""
    timings = {}
    for name, run in runners.items():
        run()  # warm-up
        wall, cpu = [], []
        for _ in range(rounds):
            started, started_cpu = time.perf_counter(), time.process_time()
            run()
            wall.append(time.perf_counter() - started)
            cpu.append(time.process_time() - started_cpu)
        timings[name] = (statistics.median(wall) * 1e3, statistics.median(cpu) * 1e3)
    return timings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--count", type=int, default=16, help="rendered lines to read (default: 16)")
    parser.add_argument("--batch", type=int, default=16, help="lines per batch in the batched setting")
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--weights", help="converted safetensors (default: convert rapidocr's model to a temp dir)")
    parser.add_argument("--json", action="store_true", help="also print the results as one JSON object")


def main(argv: list[str] | None = None) -> int:
    import onnxruntime as ort

    parser = argparse.ArgumentParser(prog="gravityocr bench tower", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    source = rapidocr_model_path()
    with tempfile.TemporaryDirectory() as scratch:
        weights = args.weights or convert_onnx(source, Path(scratch) / "ppocr_rec.safetensors")
        model = load_ppocr_recognizer(weights)

    lines = make_lines(args.count)
    singles = [preprocess(image)[None] for _, image in lines]
    batches = [preprocess_batch([image for _, image in lines[start:start + args.batch]])
               for start in range(0, len(lines), args.batch)]
    widths = [x.shape[-1] for x in singles]
    print(f"tower bench: {len(lines)} lines of {min(len(t) for t, _ in lines)}-{max(len(t) for t, _ in lines)} "
          f"characters, 48 px high, widths {min(widths)}-{max(widths)} px (batch {args.batch} padded to "
          f"{', '.join(str(b.shape[-1]) for b in batches)}), {args.rounds} rounds; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")

    rows = []
    max_diff = 0.0
    same_argmax = True
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        session = ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])

        def onnx(inputs: list[torch.Tensor]) -> list[np.ndarray]:
            return [session.run(None, {"x": x.numpy()})[0] for x in inputs]

        with torch.inference_mode():
            for label, inputs in (("1", singles), (str(args.batch), batches)):
                timings = measure({
                    "onnxruntime": lambda: onnx(inputs),
                    "torch": lambda: [model.probabilities(x) for x in inputs],
                    "torch_sequence": lambda: [model(x) for x in inputs],
                }, args.rounds)
                row = {"threads": threads, "batch": label}
                for name, (wall, cpu) in timings.items():
                    row[name] = wall / len(lines)
                    row[f"{name}_cpu"] = cpu / len(lines)
                rows.append(row)
                if threads == 1:
                    for x, reference in zip(inputs, onnx(inputs)):
                        ours = model.probabilities(x).numpy()
                        max_diff = max(max_diff, float(np.abs(ours - reference).max()))
                        same_argmax &= bool(np.array_equal(ours.argmax(-1), reference.argmax(-1)))

    print("ms per line, wall (process CPU):")
    print(f"{'threads':>7} {'batch':>5} {'onnxruntime':>16} {'torch':>16} {'ratio':>6} {'torch to seq':>16}")
    for row in rows:
        cells = [f"{row[name]:7.1f} ({row[name + '_cpu']:6.1f})" for name in ("onnxruntime", "torch", "torch_sequence")]
        print(f"{row['threads']:>7} {row['batch']:>5} {cells[0]:>16} {cells[1]:>16} "
              f"{row['torch'] / row['onnxruntime']:6.2f} {cells[2]:>16}")
    print(f"max |torch - onnxruntime| probability {max_diff:.2e}, argmax identical: {same_argmax}; "
          f"load average now {os.getloadavg()[0]:.1f}")
    if args.json:
        print(json.dumps({"rows": rows, "max_abs_diff": max_diff, "same_argmax": same_argmax}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
