"""`report --follow --serve PORT`: the live page over HTTP on 127.0.0.1 (`ssh -L PORT:127.0.0.1:PORT NODE` shows
it from a laptop), from the follower's own process: the standard library's http.server, one thread.

Only the page is served (`/` and `/report.html`), never the run directory: its checkpoints and configs are not
the page's to hand out, even on the loopback address. The page is the follower's own last one, kept in memory,
not report.html as it is on disk: at the run's end `train` writes its own report there (no reload script), and
a browser that reloaded onto it would stop before the follower's final page."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from sftdoctor.errors import InputError
from sftdoctor.run import layout

NOT_YET = (
    b"<!DOCTYPE html><html><head><meta charset='utf-8'><meta http-equiv='refresh' content='1'></head>"
    b"<body>sftdoctor: no page written yet; this one reloads until there is.</body></html>\n"
)


def handler(latest: Callable[[], bytes | None]) -> type[BaseHTTPRequestHandler]:
    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send(body=True)

        def do_HEAD(self) -> None:  # the live page asks before it reloads
            self.send(body=False)

        def send(self, body: bool) -> None:
            if self.path.split("?", 1)[0] not in ("/", f"/{layout.REPORT}"):
                self.send_error(404, f"only the run's page is served here: /{layout.REPORT}")
                return
            data = latest()
            status = 200 if data is not None else 503  # asked before the first drawing: a page that asks again
            data = data if data is not None else NOT_YET
            self.send_response(status)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            if body:
                self.wfile.write(data)

        def log_message(self, format, *args) -> None:  # the follower's terminal says what the run does
            pass

    return Page


def serve(latest: Callable[[], bytes | None], port: int) -> ThreadingHTTPServer:
    """`latest()` (the follower's last page, None before its first) served from a daemon thread on
    127.0.0.1:`port` (0: a free port, in `server_address`); InputError when the port cannot be had."""
    try:
        server = ThreadingHTTPServer(("127.0.0.1", port), handler(latest))
    except OSError as exc:
        raise InputError("--serve", f"cannot listen on 127.0.0.1:{port}: {exc.strerror or exc}") from None
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="sftdoctor-serve", daemon=True).start()
    return server
