"""`gravityocr serve`: run the HTTP API on Ray Serve until interrupted."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import yaml

from .settings import ServeSettings

DEFAULT_CONFIG = Path(__file__).resolve().parent / "serve_config.yaml"


def load_serve_config(path: str | Path) -> tuple[dict, ServeSettings, dict]:
    """(http_options, settings, deployment options) from a Serve config file, the same file
    `serve deploy` takes."""
    raw = yaml.safe_load(Path(path).read_text()) or {}
    applications = raw.get("applications") or []
    if len(applications) != 1:
        raise ValueError(f"{path}: expected exactly one application, found {len(applications)}")
    application = applications[0]
    deployments = {d.get("name"): d for d in application.get("deployments") or []}
    options = {k: v for k, v in deployments.get("OcrService", {}).items() if k != "name"}
    return raw.get("http_options") or {}, ServeSettings.from_args(application.get("args")), options


def add_arguments(parser) -> None:
    parser.add_argument("--host", default=None, help="listen address (default from the config, else 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="listen port (default from the config, else 8000)")
    parser.add_argument("--config", default=str(DEFAULT_CONFIG), help="Serve config file (the one `serve deploy` takes)")
    parser.add_argument("--address", help="Ray cluster address (default: a local Ray)")
    parser.add_argument("--model", help="model directory or hub name (overrides the config)")
    parser.add_argument("--mode", choices=("spec", "ar"), help="decoding mode (overrides the config)")
    parser.add_argument("--draft-ahead", type=int, metavar="L",
                        help="draft-ahead rounds with blocks of L masks, 0 for classic rounds (overrides the config)")
    parser.add_argument("--draft-branches", type=int, metavar="N",
                        help="second-choice branches per draft-ahead round (overrides the config)")
    parser.add_argument("--draft-ahead-max-batch", type=int, metavar="N",
                        help="draft-ahead rounds only while at most N crops decode together, classic rounds "
                             "above; 0: at any batch size (overrides the config)")
    parser.add_argument("--speculative-max-batch", type=int, metavar="N",
                        help="speculative rounds only while at most N crops decode together, AR rounds above; "
                             "0: at any batch size (overrides the config; default: the device's)")


def run(args) -> int:
    import ray
    from ray import serve

    from .app import build_app

    http_options, settings, options = load_serve_config(args.config)
    if args.model:
        settings.model = args.model
    if args.mode:
        settings.mode = args.mode
    if args.draft_ahead is not None:
        settings.draft_ahead = args.draft_ahead
    if args.draft_branches is not None:
        settings.draft_branches = args.draft_branches
    if args.draft_ahead_max_batch is not None:
        settings.draft_ahead_max_batch = args.draft_ahead_max_batch
    if args.speculative_max_batch is not None:
        settings.speculative_max_batch = args.speculative_max_batch
    try:
        settings.check()  # the config's settings with the command line's overrides
    except ValueError as error:
        raise SystemExit(f"gravityocr serve: {error}") from None
    host = args.host or http_options.get("host", "127.0.0.1")
    port = args.port or http_options.get("port", 8000)
    ray.init(address=args.address, log_to_driver=False)
    serve.start(http_options={"host": host, "port": port})
    serve.run(build_app(settings, options), name="gravityocr", route_prefix="/", blocking=False)
    print(f"GravityOCR is serving on http://{host}:{port}  (OpenAPI: /docs, /openapi.json); Ctrl-C stops it")
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    serve.shutdown()
    return 0
