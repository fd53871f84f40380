#!/usr/bin/env python3
"""A fault-injecting HTTP/1.1 reverse proxy for the S3 tests (python3 stdlib only).

Forwards every request to --upstream unchanged (method, path and query, every header
including Host, over which the SigV4 signature is computed, and the body) and relays the
response. Faults come from the JSON file --control, read again on every request so that a
test can change it while the proxy runs (write it whole, e.g. to a temporary name and
rename):
  {"slowdown_requests": N}   the next N requests get 503 SlowDown (their body drained first)
  {"slowdown_seconds": T}    every request gets 503 SlowDown for T seconds from when the
                             proxy first read this setting
  {"truncate_get_bytes": K}  a GET answered 200/206 gets its headers but only the first K
                             bytes of its body, then the connection is closed
  {"truncate_get_requests": N}  with truncate_get_bytes: only the next N such GETs are cut
  {"slowdown_method": "PUT"}  the slowdowns above only for requests of this method
  {"delay_ms": D}            every request held D ms before it is forwarded (a slow link,
                             so that a test can stop the server in the middle of an upload)
  {"delay_path": S}          with delay_ms: only requests whose path contains S are held
  {"lose_answer": {"method": M, "path": S, "requests": N}}
                             the next N requests of method M whose path (and query)
                             contains S are forwarded and done upstream, but their answer
                             is lost: the client's connection is closed without it
  {"error_in_200": {"method": M, "path": S, "requests": N}}
                             the next N such requests are not forwarded: a 200 whose body
                             is an <Error> (InternalError), as S3 fails a long
                             CompleteMultipartUpload
A budget (N, T) starts again whenever the file is rewritten. With the upstream down, the
proxy closes the client's connection without an answer, as a dead server would.
It keeps --stats up to date ({"requests", "slowdowns", "truncated", "upstream_errors"},
and "ranges": each path's ranged GETs, their Range headers in the order they came),
written before the answer it counts goes out. Usage:
  slowdown_proxy.py --upstream http://127.0.0.1:PORT --port-file F [--port 0]
                    [--control F] [--stats F] [--verbose]
"""
import argparse
import http.client
import http.server
import json
import os
import socket
import sys
import threading
import time
import urllib.parse

SLOWDOWN_BODY = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
                 b'<Message>Please reduce your request rate.</Message></Error>')
ERROR_IN_200_BODY = (b'<?xml version="1.0" encoding="UTF-8"?>\n\n<Error><Code>InternalError</Code>'
                     b'<Message>We encountered an internal error. Please try again.</Message></Error>')
BLOCK = 1 << 20


def write_atomically(path, text):
    tmp = f"{path}.tmp{os.getpid()}.{threading.get_ident()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


class Faults:
    """The control file's settings and what is left of their budgets; the counters."""

    def __init__(self, control, stats):
        self.control, self.stats_path = control, stats
        self.lock = threading.Lock()
        self.key = None          # identity of the control file version in force
        self.settings = {}
        self.slowdowns_left = 0
        self.slowdown_until = 0.0
        self.truncations_left = None  # None: every GET
        self.matched_left = {}   # fault name -> requests it still takes
        self.stats = {"requests": 0, "slowdowns": 0, "truncated": 0, "upstream_errors": 0, "lost_answers": 0,
                      "errors_in_200": 0, "ranges": {}}

    def _reload(self):
        if not self.control:
            return
        try:
            st = os.stat(self.control)
            key = (st.st_ino, st.st_mtime_ns, st.st_size)
            if key == self.key:
                return
            with open(self.control) as f:
                settings = json.load(f)
        except FileNotFoundError:
            key, settings = None, {}
        except (OSError, ValueError):
            return  # half-written: keep what is in force
        if key == self.key:
            return
        self.key, self.settings = key, settings
        self.slowdowns_left = int(settings.get("slowdown_requests", 0))
        self.slowdown_until = time.monotonic() + float(settings.get("slowdown_seconds", 0))
        n = settings.get("truncate_get_requests")
        self.truncations_left = None if n is None else int(n)
        self.matched_left = {name: int(settings[name].get("requests", 1))
                             for name in ("lose_answer", "error_in_200") if name in settings}

    def takes(self, name, method, path):
        """Whether fault `name` ({"method", "path", "requests"}) takes this request; counted."""
        with self.lock:
            self._reload()
            f = self.settings.get(name)
            if not f or self.matched_left.get(name, 0) <= 0:
                return False
            if f.get("method", method) != method or f.get("path", "") not in path:
                return False
            self.matched_left[name] -= 1
            self.stats["lost_answers" if name == "lose_answer" else "errors_in_200"] += 1
            self._write_stats()
            return True

    def should_slow_down(self, method, path, range_header=None):
        """Counts the request; returns (answer 503?, seconds to hold it first)."""
        with self.lock:
            self.stats["requests"] += 1
            if method == "GET" and range_header:
                self.stats["ranges"].setdefault(urllib.parse.urlsplit(path).path, []).append(range_header)
            self._reload()
            delay = float(self.settings.get("delay_ms", 0)) / 1000
            if self.settings.get("delay_path", "") not in path:
                delay = 0
            only = self.settings.get("slowdown_method")
            if only is not None and only != method:
                self._write_stats()
                return False, delay
            slow = self.slowdowns_left > 0 or time.monotonic() < self.slowdown_until
            if self.slowdowns_left > 0:
                self.slowdowns_left -= 1
            if slow:
                self.stats["slowdowns"] += 1
            self._write_stats()
            return slow, delay

    def truncate_bytes(self):
        """How many body bytes to send of a GET's 200/206 answer; None: all of them."""
        with self.lock:
            k = self.settings.get("truncate_get_bytes")
            if k is None or self.truncations_left == 0:
                return None
            if self.truncations_left is not None:
                self.truncations_left -= 1
            self.stats["truncated"] += 1
            self._write_stats()
            return int(k)

    def count(self, what):
        with self.lock:
            self.stats[what] += 1
            self._write_stats()

    def _write_stats(self):
        """Under the lock, before the client gets its answer, so a client that has its
        answer finds the figures up to date."""
        if self.stats_path:
            write_atomically(self.stats_path, json.dumps(self.stats))


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive

    def log_message(self, fmt, *args):
        if self.server.verbose:
            sys.stderr.write("proxy: " + fmt % args + "\n")

    def body_chunks(self):
        """The request body as it came (raw chunked framing kept), in blocks."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            while True:
                line = self.rfile.readline(65537)
                yield line
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while True:  # trailers up to the empty line
                        line = self.rfile.readline(65537)
                        yield line
                        if line in (b"\r\n", b"\n", b""):
                            return
                left = size + 2  # the data and its CRLF
                while left > 0:
                    data = self.rfile.read(min(left, BLOCK))
                    if not data:
                        raise ConnectionError("client closed mid-body")
                    left -= len(data)
                    yield data
        else:
            left = int(self.headers.get("Content-Length", 0))
            while left > 0:
                data = self.rfile.read(min(left, BLOCK))
                if not data:
                    raise ConnectionError("client closed mid-body")
                left -= len(data)
                yield data

    def proxy(self):
        faults = self.server.faults
        slow, delay = faults.should_slow_down(self.command, self.path, self.headers.get("Range"))
        if delay > 0:
            time.sleep(delay)
        if slow:
            for _ in self.body_chunks():
                pass
            self.send_response_only(503, "Slow Down")
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(SLOWDOWN_BODY)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(SLOWDOWN_BODY)
            self.log_request(503)
            return
        if faults.takes("error_in_200", self.command, self.path):
            for _ in self.body_chunks():
                pass
            self.send_response_only(200, "OK")
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(ERROR_IN_200_BODY)))
            self.end_headers()
            self.wfile.write(ERROR_IN_200_BODY)
            self.log_request(200)
            return
        lose = faults.takes("lose_answer", self.command, self.path)
        try:
            resp = self.forward()
            if lose:  # done upstream; the answer never reaches the client
                resp.read()
                self.log_message("%s: answer %d lost", self.path, resp.status)
                self.close_connection = True
                self.upstream_close()
                return
        except (OSError, http.client.HTTPException) as e:
            faults.count("upstream_errors")
            self.log_message("upstream: %s: closing the client's connection", e)
            self.close_connection = True
            self.upstream_close()
            return
        self.relay(resp)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_OPTIONS = do_PATCH = proxy

    def upstream_close(self):
        conn = getattr(self, "upstream", None)
        if conn is not None:
            conn.close()
            self.upstream = None

    def forward(self):
        if getattr(self, "upstream", None) is None:
            u = self.server.upstream
            self.upstream = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
        conn = self.upstream
        conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
        for name, value in self.headers.items():
            conn.putheader(name, value)
        conn.endheaders()
        for data in self.body_chunks():
            conn.send(data)
        return conn.getresponse()

    def relay(self, resp):
        chunked = "chunked" in (resp.getheader("Transfer-Encoding") or "").lower()
        cut = None
        if self.command == "GET" and resp.status in (200, 206):
            cut = self.server.faults.truncate_bytes()
        self.send_response_only(resp.status, resp.reason)
        for name, value in resp.getheaders():
            self.send_header(name, value)  # "Connection: close" also closes ours
        self.end_headers()
        sent = 0
        try:
            while True:
                want = BLOCK if cut is None else min(BLOCK, cut - sent)
                data = resp.read(want) if want > 0 else b""
                if not data:
                    break
                if chunked:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                else:
                    self.wfile.write(data)
                sent += len(data)
            if cut is not None:
                self.close_connection = True
                self.upstream_close()
                self.log_message("%s: body cut after %d bytes", self.path, sent)
            else:
                resp.close()  # all read: the upstream connection can take the next request
                if chunked:
                    self.wfile.write(b"0\r\n\r\n")
        except (OSError, http.client.HTTPException) as e:  # upstream or client gone mid-body
            self.log_message("relay: %s", e)
            self.close_connection = True
            self.upstream_close()
        if resp.will_close or self.close_connection:
            self.upstream_close()
            self.close_connection = True
        self.log_request(resp.status)

    def finish(self):
        self.upstream_close()
        super().finish()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstream", required=True, help="http://127.0.0.1:PORT")
    ap.add_argument("--port", type=int, default=0, help="0: any free port")
    ap.add_argument("--port-file", help="where to write the port once listening")
    ap.add_argument("--control", help="JSON file with the faults to inject")
    ap.add_argument("--stats", help="JSON file with what was done")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    server.upstream = urllib.parse.urlsplit(args.upstream)
    server.faults = Faults(args.control, args.stats)
    server.verbose = args.verbose
    with server.faults.lock:
        server.faults._write_stats()
    port = server.server_address[1]
    if args.port_file:
        write_atomically(args.port_file, f"{port}\n")
    if args.verbose:
        print(f"proxy: 127.0.0.1:{port} -> {args.upstream}", file=sys.stderr)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
