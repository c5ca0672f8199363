"""harness/processes.py: the loopback servers that tests and benchmarks start."""

from __future__ import annotations

import sys
import textwrap
import urllib.request

import pytest

from harness import processes
from harness.processes import free_port, server

# Serves /health, and writes 8 KiB to stderr for every request it answers (a server logging each request).
CHATTY = textwrap.dedent(
    """
    import sys
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            sys.stderr.write("x" * 8192 + "\\n")
            sys.stderr.flush()
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args):
            pass

    HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
    """
)


@pytest.mark.parametrize("piped", [False, True], ids=["file", "mutation"])
def test_a_server_logging_every_request_keeps_serving(monkeypatch: pytest.MonkeyPatch, piped: bool) -> None:
    """64 requests write 512 KiB to stderr, eight times a pipe's buffer: the server keeps answering. The mutation
    hands the server an unread pipe, as the harness did: its 8th or so log line blocks it, and the next request
    times out (a benchmark's backend stalled so after about 600 requests)."""
    if piped:
        real = processes.subprocess.Popen
        monkeypatch.setattr(
            processes.subprocess,
            "Popen",
            lambda argv, **kw: real(argv, **{**kw, "stderr": processes.subprocess.PIPE}),
        )
    port = free_port()
    url = f"http://127.0.0.1:{port}/health"
    with server([sys.executable, "-c", CHATTY, str(port)], url):

        def ask_all() -> None:
            for _ in range(64):
                with urllib.request.urlopen(url, timeout=5) as resp:
                    assert resp.read() == b"ok"

        if piped:
            with pytest.raises(OSError):  # the read timeout: the server is blocked on its stderr
                ask_all()
        else:
            ask_all()


def test_a_server_that_exits_first_is_an_error_with_its_stderr() -> None:
    script = "import sys; sys.stderr.write('no model file here'); sys.exit(3)"
    port = free_port()
    started = server([sys.executable, "-c", script], f"http://127.0.0.1:{port}/health", ready_timeout_s=30)
    with pytest.raises(RuntimeError, match="no model file here"), started:
        pass
