"""What the Python tests share: a timestamped log line, a free port, and a /metrics endpoint
serving an exposition.

A test script imports it with its own folder's sibling on the path:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
    from testlib import free_port, log, metrics_server
"""
import http.server
import socket
import time


def log(*args):
    """One progress line, prefixed with the wall-clock time, flushed at once."""
    print(time.strftime("%H:%M:%S"), *args, flush=True)


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metrics_server(exposition):
    """An HTTP server on 127.0.0.1 (a free port: server.server_address[1]), not yet serving, that
    answers GET /metrics with exposition() in Prometheus' text format and 404 for anything else."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path != "/metrics":
                self.send_error(404)
                return
            body = exposition().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    return http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
