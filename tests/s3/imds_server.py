#!/usr/bin/env python3
"""A stand-in for the EC2 instance metadata service, IMDSv2 only, for the credential tests
(python3 stdlib only). No EC2 instance is reachable from the test machines; this answers
the calls AWS documents, as an instance that requires IMDSv2 does:
  PUT /latest/api/token with X-aws-ec2-metadata-token-ttl-seconds (1-21600): a token;
      without the header 400, with X-Forwarded-For 403 (what IMDS does)
  GET with X-aws-ec2-metadata-token: a token it gave; without one 401 (IMDSv1 refused)
  GET /latest/meta-data/iam/security-credentials/        the role's name
  GET /latest/meta-data/iam/security-credentials/ROLE    the role's credentials (JSON: Code,
      Type, AccessKeyId, SecretAccessKey, Token, Expiration, LastUpdated)
  GET /latest/meta-data/placement/region                 the region
The role's keys are this process's AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (the S3
test server's user), with a session token and an expiry --expire-seconds from each answer.
It keeps --stats up to date: {"tokens", "credentials", "unauthorized", "requests"}.
Usage: imds_server.py --port-file F [--stats F] [--role NAME] [--region R] [--expire-seconds S]
"""
import argparse
import datetime
import http.server
import json
import os
import secrets
import threading


def write_atomically(path, text):
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def answer(self, status, body=b"", content_type="text/plain"):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def count(self, what):
        server = self.server
        with server.lock:
            server.stats[what] += 1
            if server.stats_path:
                write_atomically(server.stats_path, json.dumps(server.stats))

    def do_PUT(self):
        self.count("requests")
        n = int(self.headers.get("Content-Length", 0))
        if n:
            self.rfile.read(n)
        if self.path != "/latest/api/token":
            return self.answer(404)
        if self.headers.get("X-Forwarded-For"):
            return self.answer(403)
        ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", "")
        if not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
            return self.answer(400)
        token = secrets.token_urlsafe(32)
        with self.server.lock:
            self.server.tokens.add(token)
        self.count("tokens")
        self.answer(200, token.encode())

    def do_GET(self):
        self.count("requests")
        server = self.server
        token = self.headers.get("X-aws-ec2-metadata-token")
        with server.lock:
            known = token in server.tokens
        if not known:
            self.count("unauthorized")
            return self.answer(401)
        base = "/latest/meta-data/iam/security-credentials/"
        if self.path == base:
            return self.answer(200, server.role.encode())
        if self.path == base + server.role:
            now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
            expires = now + datetime.timedelta(seconds=server.expire_seconds)
            fmt = "%Y-%m-%dT%H:%M:%SZ"
            body = {
                "Code": "Success",
                "LastUpdated": now.strftime(fmt),
                "Type": "AWS-HMAC",
                "AccessKeyId": os.environ["AWS_ACCESS_KEY_ID"],
                "SecretAccessKey": os.environ["AWS_SECRET_ACCESS_KEY"],
                "Token": "IQoJb3JpZ2luX2VjE" + secrets.token_urlsafe(48),
                "Expiration": expires.strftime(fmt),
            }
            self.count("credentials")
            return self.answer(200, json.dumps(body, indent=2).encode())
        if self.path == "/latest/meta-data/placement/region":
            return self.answer(200, server.region.encode())
        self.answer(404)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port-file", required=True)
    ap.add_argument("--stats")
    ap.add_argument("--role", default="trident-test-role")
    ap.add_argument("--region", default="us-east-1")
    ap.add_argument("--expire-seconds", type=int, default=6 * 3600)
    args = ap.parse_args()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.lock = threading.Lock()
    server.tokens = set()
    server.stats = {"tokens": 0, "credentials": 0, "unauthorized": 0, "requests": 0}
    server.stats_path = args.stats
    server.role, server.region, server.expire_seconds = args.role, args.region, args.expire_seconds
    if args.stats:
        write_atomically(args.stats, json.dumps(server.stats))
    write_atomically(args.port_file, f"{server.server_address[1]}\n")
    server.serve_forever()


if __name__ == "__main__":
    main()
