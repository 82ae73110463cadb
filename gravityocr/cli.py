"""The `gravityocr` command: one entry point, a subcommand per job.

Only the module of the subcommand being run is imported, so `gravityocr --help` does not
pay for torch and Ray.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module with add_arguments(parser) and run(args), help)
COMMANDS = {
    "batch": ("gravityocr.pipelines.batch_cli",
              "OCR every document under INPUT into OUTPUT (local, file:// or s3://) on Ray"),
    "ocr": ("gravityocr.pipelines.ocr_cli", "OCR local files in-process and print or write markdown/JSON"),
    "serve": ("gravityocr.serve.cli", "serve the OCR HTTP API on Ray Serve"),
    "train": ("gravityocr.model.training.train", "train a recogniser with the joint objective"),
    "train-strips": ("gravityocr.model.training.strips",
                     "train the default reader (PP-OCRv6 strips under the text decoder) on a corpus build"),
    "grpo": ("gravityocr.model.training.grpo", "GRPO on the AR path with OCR rewards, from trained weights"),
    "eval": ("gravityocr.model.evaluation.eval_command", "score a recogniser on an evaluation set: crops, and pages through the page pipeline"),
    "data": ("gravityocr.corpus.build",
             "build training shards or a real evaluation set from Debian documentation packages"),
    "average": ("gravityocr.model.training.averaging", "average the weights of recognisers trained from the same start"),
}
# bench subcommand -> (module with main(argv) -> int, help)
BENCHMARKS = {
    "ablation": ("gravityocr.bench.ablation", "joint vs AR-only vs no-AR training at a matched budget, held-out scores"),
    "decode": ("gravityocr.bench.decode", "AR vs self-speculative decode speed by batch size and content type"),
    "real": ("gravityocr.bench.real", "ours vs rapidocr vs tesseract on data/real: line and page scores, speed"),
    "pages": ("gravityocr.bench.pages", "seconds per page and page score: ours (AR, spec), peers, and ours through "
                                        "ocr, batch and serve"),
    "layering": ("gravityocr.bench.layering", "imports that run against the layering (network <- decode <- engine "
                                              "<- recognizer <- pipelines <- serve)"),
    "samples": ("gravityocr.bench.samples", "page score and seconds per bundled sample with a true text (samples/*.md)"),
    "batch": ("gravityocr.bench.batch", "batch job pages/s for 1 and 2 engine actors, AR vs spec, peak memory"),
    "lanes": ("gravityocr.bench.lanes", "online latency alone and beside a batch job through Serve; job pages/s "
                                        "through Serve vs own actors; memory"),
    "serve": ("gravityocr.bench.serve", "HTTP latency p50/p99 and requests/s by concurrency, AR vs spec"),
    "train-step": ("gravityocr.bench.train_step", "seconds per training step: one padded pass vs micro-batches"),
    "tower": ("gravityocr.bench.tower", "ms per line: torch PP-OCRv6 recognizer vs onnxruntime, batch 1 and 16, 1-2 threads"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gravityocr",
                                     description="Batch and online OCR with exact self-speculative decoding.")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        sub = commands.add_parser(name, help=help_text)
        if name == command:
            module = importlib.import_module(module_name)
            module.add_arguments(sub)
            sub.set_defaults(run=module.run)
    bench = commands.add_parser("bench", help="benchmarks that print figures")
    bench.add_argument("benchmark", choices=sorted(BENCHMARKS), help="which benchmark")
    bench.add_argument("options", nargs=argparse.REMAINDER, help="the benchmark's own options (see its --help)")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((word for word in argv if not word.startswith("-")), None)
    args = build_parser(command).parse_args(argv)
    if args.command == "bench":
        module = importlib.import_module(BENCHMARKS[args.benchmark][0])
        return module.main(args.options)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
