"""`gravityocr batch`'s command line: its flags, the one-line refusals of flags that cannot
go together, the summary it prints and its exit code (the job itself: pipelines/batch_job.py)."""

from __future__ import annotations

import json
import sys

from gravityocr.model.decode.settings import add_decode_arguments, decode_settings_from_args
from gravityocr.pipelines.batch_job import BatchJobConfig, ServeAppNotFound, run_batch_job
from gravityocr.model.decode.flags import add_model_argument
from gravityocr.pipelines.page_ocr import PageOcrConfig, add_page_arguments
from gravityocr.pipelines.page_readers import DEFAULT_SERVE_APP
from gravityocr.pipelines.progress import BatchProgress
from gravityocr.pipelines.storage import StorageError

EXIT_DOCUMENTS_FAILED = 3  # the job ran to its end, and some documents could not be read

def add_arguments(parser) -> None:
    parser.add_argument("input", help="local folder, file://… or s3://bucket/prefix of PDFs and images")
    parser.add_argument("output", help="local folder, file://… or s3://bucket/prefix for markdown and Parquet")
    parser.add_argument("--address", help="Ray cluster address (default: a local Ray started for the job)")
    parser.add_argument("--endpoint-url", help="S3-compatible endpoint (MinIO, Ceph, …); default AWS_ENDPOINT_URL")
    parser.add_argument("--serve-app", nargs="?", const=DEFAULT_SERVE_APP, metavar="NAME",
                        help="read the pages through the running Serve application NAME on the cluster given by "
                             f"--address (default NAME: {DEFAULT_SERVE_APP}): its replicas' engines, after their "
                             "online requests, instead of engine actors of the job's own; the application's "
                             "settings then decide the model and decoding")
    parser.add_argument("--min-actors", type=int, default=None,
                        help="engine actors the pool keeps however little work there is (default: 1)")
    parser.add_argument("--max-actors", type=int, default=None,
                        help="engine actors the pool grows to while pages wait (default: 2)")
    parser.add_argument("--resume", action="store_true", help="skip documents whose outputs are complete")
    add_model_argument(parser)
    parser.add_argument("--pages-per-batch", type=int, default=4,
                        help="pages an engine actor reads together, their crops batched in one engine (default: 4)")
    add_page_arguments(parser)
    parser.add_argument("--max-new-tokens", type=int, help="cap on the tokens read per region")
    parser.add_argument("--actor-resources", type=json.loads, default={},
                        help='custom Ray resources each engine actor needs, as JSON, e.g. \'{"engine": 1}\'')
    add_decode_arguments(parser, with_mode=True)


# Flags that set up the job's own engine actors: with --serve-app the application's replicas
# read the pages under the application's own settings, so these would be silently ignored.
ENGINE_FLAGS = {"model": "--model", "max_new_tokens": "--max-new-tokens", "min_actors": "--min-actors",
                "max_actors": "--max-actors", "actor_resources": "--actor-resources", "mode": "--mode",
                "block_size": "--block-size", "speculative_max_batch": "--speculative-max-batch"}


def run(args) -> int:
    if args.serve_app:
        given = [flag for name, flag in ENGINE_FLAGS.items() if getattr(args, name, None) not in (None, {})]
        if given:
            raise SystemExit(f"gravityocr batch: {', '.join(given)} set up the job's own engine actors; with "
                             f"--serve-app the application {args.serve_app!r} reads the pages with its own "
                             "settings (its Serve config, or `gravityocr serve`'s flags)")
    try:
        decode = decode_settings_from_args(args)
        config = BatchJobConfig(
            input_uri=args.input, output_uri=args.output, endpoint_url=args.endpoint_url, address=args.address,
            min_actors=1 if args.min_actors is None else args.min_actors,
            max_actors=2 if args.max_actors is None else args.max_actors, resume=args.resume,
            page=PageOcrConfig.from_args(args), decode=decode, model=args.model,
            pages_per_batch=args.pages_per_batch, max_new_tokens=args.max_new_tokens, actor_resources=args.actor_resources,
            serve_app=args.serve_app,
        )
        config.check()
    except ValueError as error:
        raise SystemExit(f"gravityocr batch: {error}") from None
    try:
        summary = run_batch_job(config, BatchProgress())
    except (StorageError, ServeAppNotFound) as error:  # a folder that is a file, a bucket that does not exist ...
        raise SystemExit(f"gravityocr batch: {error}") from None
    print(f"documents: {summary.documents} ({summary.documents_failed} failed, {summary.documents_skipped} "
          f"already complete)   pages: {summary.pages} ({summary.page_errors} with errors)   "
          f"{summary.pages_per_second:.2f} pages/s   TPF {summary.tpf:.2f} ({summary.speculative_rounds} speculative "
          f"rounds, {summary.ar_rounds} AR rounds)   {summary.seconds:.1f} s")
    for error in summary.errors:
        print(f"  error {error['document_id']} page {error['page_number']}: {error['reason']}: {error['message']}")
    print(f"outputs: {config.output_uri}   read by: {summary.engine}")
    if summary.documents_failed:
        print(f"gravityocr batch: {summary.documents_failed} of {summary.documents} documents failed (exit code "
              f"{EXIT_DOCUMENTS_FAILED}); their error rows are in the Parquet output, --resume reads them again",
              file=sys.stderr)
        return EXIT_DOCUMENTS_FAILED
    return 0
