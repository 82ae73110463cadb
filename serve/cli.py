"""`gravityocr serve`: run the HTTP API on Ray Serve until interrupted.

The first Ctrl-C (SIGINT) or SIGTERM stops it, whenever it comes (while Ray starts, while
the model loads, while serving): Serve is shut down within `SHUTDOWN_GRACE_S`, then the
local Ray this command started, and the command exits. A second signal during that
shutdown exits at once, killing what is left of the local Ray this command started.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

import yaml

from gravityocr.model.decode.settings import add_decode_arguments, decode_settings_from_args
from gravityocr.model.decode.flags import add_model_argument
from gravityocr.pipelines.page_ocr import add_page_arguments
from gravityocr.serve.settings import ServeSettings

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
    add_model_argument(parser, default_text="the config's")
    add_page_arguments(parser, dpi=False, defaults_from="the config's, else the page pipeline's")
    add_decode_arguments(parser, with_mode=True, defaults_from="the config's `decode:`")


def run(args) -> int:
    import ray
    from ray import serve

    from gravityocr.serve.app import build_app

    http_options, settings, options = load_serve_config(args.config)
    if args.model:
        settings.model = args.model
    try:
        settings.page = settings.page.overridden(layout=args.layout, lines=args.lines)
        settings.decode = decode_settings_from_args(args, base=settings.decode)
        settings.check()  # the config's settings with the command line's overrides
    except ValueError as error:
        raise SystemExit(f"gravityocr serve: {error}") from None
    host = args.host or http_options.get("host", "127.0.0.1")
    port = args.port or http_options.get("port", 8000)
    stopper = _Stopper()
    stopper.install()  # before Ray starts: a Ctrl-C while it starts or the model loads stops too
    try:
        ray.init(address=args.address, log_to_driver=False)
        stopper.install()  # ray.init sets a SIGTERM handler of its own (sys.exit): ours again
        stopper.checkpoint()
        serve.start(http_options={"host": host, "port": port})
        stopper.checkpoint()
        # serve.run returns once the app runs, after the model loaded (minutes for a large
        # one): it waits on a thread of its own, so a signal meanwhile stops at once.
        stopper.wait_for(lambda: serve.run(build_app(settings, options), name="gravityocr", route_prefix="/",
                                           blocking=False))
        print(f"GravityOCR is serving on http://{host}:{port}  (OpenAPI: /docs, /openapi.json); Ctrl-C stops it",
              flush=True)
        stopper.wait_for(None)
    except _Stop as stop:
        print(f"gravityocr serve: {signal.Signals(stop.signum).name} received, stopping", file=sys.stderr,
              flush=True)
    finally:
        stopper.stopping()
        _shutdown(ray, serve)
    return 0


# Serve's own shutdown lets in-flight requests finish (a replica waits up to 20 s for them,
# the client up to 30 s for the controller); past this grace the command stops Ray without
# waiting (the local Ray it started ends Serve's processes with it; on a cluster given by
# --address the controller carries on with the shutdown it was asked for).
SHUTDOWN_GRACE_S = 5.0


class _Stop(BaseException):
    """The first SIGINT or SIGTERM, raised in the main thread where it is safe: between Ray
    calls or in this command's own waits, never from inside Ray's code."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class _Stopper:
    """SIGINT and SIGTERM handling. The first signal is noted, and raised as `_Stop` at
    once when the main thread is in one of this command's waits, else at the next
    checkpoint (Ray's calls are not interrupted: an exception raised inside them can
    surface as a SystemError). A second one, once stopping, exits at once."""

    POLL_S = 0.2  # short sleeps, not one endless wait: a signal the kernel hands to one of
    # Ray's threads runs the handler only when the main thread next runs Python code

    def __init__(self):
        self.signum: int | None = None
        self.waiting = False  # the main thread is in time.sleep in wait_for: safe to raise there
        self.stopping_now = False

    def install(self) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._on_signal)

    def checkpoint(self) -> None:
        if self.signum is not None:
            raise _Stop(self.signum)

    def wait_for(self, work) -> None:
        """Run `work` on a thread and wait for it (None: wait for a signal); its exception
        is raised here."""
        outcome: list[BaseException] = []
        worker = None
        if work is not None:
            def call():
                try:
                    work()
                except BaseException as error:  # noqa: BLE001 - handed to the main thread
                    outcome.append(error)

            worker = threading.Thread(target=call, name="serve-start", daemon=True)
            worker.start()
        while worker is None or worker.is_alive():
            self.checkpoint()
            self.waiting = True
            try:
                time.sleep(self.POLL_S)
            finally:
                self.waiting = False
        self.checkpoint()
        if outcome:
            raise outcome[0]

    def stopping(self) -> None:
        """From now on a signal means: exit now, without the graceful shutdown."""
        self.stopping_now = True
        self.install()

    def _on_signal(self, signum, _frame) -> None:
        if self.stopping_now:
            print(f"gravityocr serve: {signal.Signals(signum).name} again, exiting now", file=sys.stderr, flush=True)
            _end_orphans(signals=(signal.SIGKILL,), grace_s=1.0)
            os._exit(128 + signum)
        if self.signum is None:
            self.signum = signum
        if self.waiting:
            self.waiting = False
            raise _Stop(signum)


def _shutdown(ray, serve) -> None:
    """Serve (bounded by SHUTDOWN_GRACE_S), then this driver's Ray: the local Ray this
    command started stops with it, a cluster given by --address only loses this driver.

    Serve's shutdown is awaited on this thread and cancelled at the grace, so no thread is
    left inside a Ray call when Ray shuts down (Ray's core worker ends the process with
    status 1 when such a call returns into a worker that is gone)."""
    if ray.is_initialized():  # else stopped while Ray was starting: only its processes to end
        try:
            asyncio.run(asyncio.wait_for(serve.shutdown_async(), SHUTDOWN_GRACE_S))
        except TimeoutError:
            print(f"gravityocr serve: Serve did not stop within {SHUTDOWN_GRACE_S:g} s; stopping Ray",
                  file=sys.stderr, flush=True)
    ray.shutdown(wait_for_processes=True)
    _end_orphans()


# Ray names the session dir of a Ray it starts session_<date>_<time>_<microseconds>_<pid of
# the process that started it>: with this process's pid, the local Ray this command started
# and no other Ray on the machine (a cluster given by --address has another's pid).
_SESSION_DIR = re.compile(rb"/session_\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d_\d+_(\d+)(?=/|\x00|$)")


def _end_orphans(signals=(signal.SIGTERM, signal.SIGKILL), grace_s: float = 3.0) -> None:
    """Kill what outlived `ray.shutdown` of the local Ray this command started (a raylet
    stopped while it was still starting leaves its agents behind): the processes whose
    command line or open files lie in that Ray's session dir. Linux only (/proc)."""
    if not os.path.isdir("/proc"):
        return
    me = os.getpid()

    def ours(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                places = [handle.read()]
            places += [os.readlink(f"/proc/{pid}/fd/{fd}").encode() for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:  # gone, or not ours to read
            return False
        return any(int(match.group(1)) == me for place in places for match in _SESSION_DIR.finditer(place))

    def orphans() -> list[int]:
        return [pid for pid in (int(entry) for entry in os.listdir("/proc") if entry.isdigit())
                if pid != me and _running(pid) and ours(pid)]

    for sig in signals:
        pids = orphans()
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(_running(pid) for pid in pids):
            time.sleep(0.1)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False
