"""The `gravityocr` command: one entry point, a subcommand per job."""

from __future__ import annotations

import argparse
import sys


def _not_yet(name: str):
    def run(args) -> int:
        print(f"gravityocr {name}: not yet available in this version", file=sys.stderr)
        return 2
    return run


def _lazy(parser: argparse.ArgumentParser, module_name: str) -> None:
    """Give a subcommand the arguments and runner of `module_name`, imported only when
    it runs: `gravityocr --help` must not pay for torch and Ray imports."""
    import importlib

    module = importlib.import_module(module_name)
    module.add_arguments(parser)
    parser.set_defaults(run=module.run)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gravityocr", description="Batch and online OCR with exact self-speculative decoding.")
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="train a recogniser with the joint objective")
    _lazy(train, "gravityocr.model.training")
    evaluate = commands.add_parser("eval", help="score a recogniser on an evaluation manifest directory")
    _lazy(evaluate, "gravityocr.model.evaluation")
    batch = commands.add_parser("batch", help="OCR every document under INPUT into OUTPUT (local, file:// or s3://) on Ray")
    _lazy(batch, "gravityocr.pipelines.batch_job")
    serve = commands.add_parser("serve", help="serve the OCR HTTP API on Ray Serve")
    _lazy(serve, "gravityocr.serve.cli")
    for name, help_text in [
        ("ocr", "OCR local files in-process and print or write markdown/JSON"),
    ]:
        sub = commands.add_parser(name, help=help_text, add_help=False)
        sub.set_defaults(run=_not_yet(name))
    bench = commands.add_parser("bench", help="benchmarks that print figures")
    bench_commands = bench.add_subparsers(dest="bench_command", required=True)
    bench_commands.add_parser("decode", help="AR vs self-speculative decode speed", add_help=False).set_defaults(
        run=_not_yet("bench decode"))
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args, rest = build_parser().parse_known_args(argv)
    args.rest = rest
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
