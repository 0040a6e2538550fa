#!/usr/bin/env python3
"""engine_double: a TEST DOUBLE of the inference engine, for the engine role's tests. Not an engine.

Serves the OpenAI-style endpoints the engine role and engine_probe use, and debug endpoints that
report what the container sees, so tests can prove the mount manifest's binds resolve inside a
container and that NAS binds are read-only:

  GET  /v1/models                 {"object": "list", "data": [{"id": DOUBLE_MODEL_ID, ...}]}
  POST /v1/chat/completions       non-stream: "a*b" (also + - /) in the last user message is
                                  answered correctly, anything else is echoed back;
                                  stream: SSE chunks "data: {...}\\n\\n", one token per chunk,
                                  max_tokens tokens at DOUBLE_TOKENS_PER_S, then "data: [DONE]"
  GET  /debug/mounts              {"mounts": [{"mount_point", "read_only", "options"}], "env": {...}}
                                  (mounts parsed from /proc/self/mountinfo, octal escapes decoded)
  POST /debug/mounts {"paths", "dirs"}
                                  the same plus "files": {path: {"readable", "sha256", "size", "error"}}
                                  and "dirs": {dir: sorted entry names, or "<error>"}
  POST /debug/try-write {"path"}  {"ok": bool, "errno": int|null, "error": str}: a directory gets a
                                  probe file created (and removed), a file is opened for writing
                                  without writing a byte
  POST /debug/switches {...}      set the stream switches below at run time (null turns one off);
                                  answers with all of them

A complete stream ends with a chunk carrying finish_reason ("length" after max_tokens tokens), then
the usage chunk when asked for, then "data: [DONE]". Switches to break it, all off by default, from the
environment or /debug/switches (stall_s, stall_after, cut_after, short_after, length_after, no_usage):
  DOUBLE_STALL_S=S, DOUBLE_STALL_AFTER=K  after K tokens (default 0: before the first) the stream stalls
                                          S seconds, then the rest comes in one burst, unpaced
  DOUBLE_CUT_AFTER=N                      after N tokens the connection is closed: no finish reason,
                                          no usage, no [DONE], no end of the chunked body
  DOUBLE_SHORT_AFTER=N                    a short answer: finish_reason "stop" after N tokens
  DOUBLE_LENGTH_AFTER=N                   a short answer that claims the limit: finish_reason "length"
                                          after N tokens
  DOUBLE_NO_USAGE=1                       never a usage chunk, even when asked (many OpenAI-compatible
                                          servers)
  DOUBLE_EXIT_AFTER_S=S, DOUBLE_EXIT_CODE=X   the process exits with code X (default 1) S seconds
                                          after it started serving, like an engine crashing

At start-up it behaves like the engine's strict-on-exists receipt writer: if any receipt root named
in DOUBLE_RECEIPT_ROOTS exists under DOUBLE_RECEIPT_PARENT (default /cache) it prints
"FileExistsError: <path>" and exits 1; otherwise it creates each root (mkdir exist_ok=False) and a
worker.json in it (open 'xb'). The tests pass the engine's names (dgx_receipts.RECEIPT_ROOTS).

Environment: DOUBLE_PORT (8000; --port wins), DOUBLE_TOKENS_PER_S (200), DOUBLE_MODEL_ID
("engine-double"), DOUBLE_STARTUP_DELAY_S (0: seconds before the
API answers, like a model load), DOUBLE_RECEIPT_PARENT (/cache), DOUBLE_RECEIPT_ROOTS
(comma-separated; none: no receipts), and the switches above. Stdlib only.
"""
import argparse
import hashlib
import json
import os
import re
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from socketserver import ThreadingMixIn
from urllib.parse import urlparse

ENV_KEYS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "HF_HUB_OFFLINE", "MODEL_PATH")
ARITH = re.compile(r"(-?\d+)\s*([*x\u00d7+/-])\s*(-?\d+)")


def write_receipts(parent, names, rank):
    """Strict-on-exists, like the engine: FileExistsError if a root from an earlier run is there."""
    os.makedirs(parent, exist_ok=True)
    for name in names:
        root = os.path.join(parent, name)
        if os.path.lexists(root):
            raise FileExistsError(root)
    for name in names:
        root = os.path.join(parent, name)
        os.mkdir(root)  # exist_ok=False semantics
        with open(os.path.join(root, "worker.json"), "xb") as handle:
            handle.write(json.dumps({"rank": rank, "pid": os.getpid(), "started": time.time()}).encode())


def answer(text):
    """The double's "model": arithmetic is answered, anything else echoed."""
    match = ARITH.search(text or "")
    if not match:
        return "echo: %s" % text
    a, op, b = int(match.group(1)), match.group(2), int(match.group(3))
    if op in ("*", "x", "\u00d7"):
        value = a * b
    elif op == "+":
        value = a + b
    elif op == "-":
        value = a - b
    else:
        value = a / b if b else "undefined"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return "%s %s %s = %s" % (a, op, b, value)


def last_user_text(messages):
    for message in reversed(messages or []):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):  # [{"type": "text", "text": ...}]
                return " ".join(part.get("text", "") for part in content if isinstance(part, dict))
            return content or ""
    return ""


MOUNTINFO_ESCAPE = re.compile(rb"\\([0-7]{3})")


def unescape_mountinfo(field):
    """The kernel writes space, tab, newline and backslash in mountinfo paths as \\ooo octal escapes."""
    raw = MOUNTINFO_ESCAPE.sub(lambda m: bytes([int(m.group(1), 8)]), field)
    return raw.decode("utf-8", "surrogateescape")


def parse_mountinfo(path="/proc/self/mountinfo"):
    mounts = []
    with open(path, "rb") as handle:
        for line in handle:
            fields = line.split()
            # id parent major:minor root mount_point options [optional...] - fstype source super_opts
            mount_point = unescape_mountinfo(fields[4])
            options = fields[5].decode("ascii", "replace").split(",")
            mounts.append({"mount_point": mount_point, "read_only": "ro" in options,
                           "options": fields[5].decode("ascii", "replace")})
    return mounts


def file_info(path):
    try:
        digest = hashlib.sha256()
        size = 0
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
                size += len(chunk)
        return {"readable": True, "sha256": digest.hexdigest(), "size": size, "error": None}
    except OSError as exc:
        return {"readable": False, "sha256": None, "size": None, "error": "%s: %s" % (type(exc).__name__, exc)}


def list_dir(path):
    try:
        return sorted(os.listdir(path))
    except OSError as exc:
        return "%s: %s" % (type(exc).__name__, exc)


def try_write(path):
    """Attempt a write without changing anything that already exists."""
    try:
        if os.path.isdir(path):
            probe = os.path.join(path, ".engine-double-write-probe")
            with open(probe, "xb"):
                pass
            os.unlink(probe)
        else:
            with open(path, "r+b"):
                pass
        return {"ok": True, "errno": None, "error": ""}
    except OSError as exc:
        return {"ok": False, "errno": exc.errno, "error": "%s: %s" % (type(exc).__name__, exc)}


def _flag(value):
    """A switch that is on or off: "0", "false", "no" and "off" are off, as JSON false is."""
    return value.strip().lower() not in ("0", "false", "no", "off") if isinstance(value, str) else bool(value)


SWITCHES = {"stall_s": ("DOUBLE_STALL_S", float), "stall_after": ("DOUBLE_STALL_AFTER", int),
            "cut_after": ("DOUBLE_CUT_AFTER", int), "short_after": ("DOUBLE_SHORT_AFTER", int),
            "length_after": ("DOUBLE_LENGTH_AFTER", int), "no_usage": ("DOUBLE_NO_USAGE", _flag)}


def switches_from(environ):
    """The stream switches set in the environment (unset or empty: off)."""
    return dict((key, convert(environ[name])) for key, (name, convert) in SWITCHES.items() if environ.get(name))


class Double(object):
    def __init__(self, model_id, tokens_per_s, ready_at, switches=None):
        self.model_id = model_id
        self.tokens_per_s = tokens_per_s
        self.ready_at = ready_at
        self.switches = dict(switches or {})

    def set_switches(self, body):
        for key, value in (body or {}).items():
            if key not in SWITCHES:
                raise ValueError("unknown switch %r (known: %s)" % (key, ", ".join(sorted(SWITCHES))))
            if value is None:
                self.switches.pop(key, None)
            else:
                self.switches[key] = SWITCHES[key][1](value)
        return dict(self.switches)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    double = None

    def log_message(self, fmt, *args):  # one line per request on stderr, container logs show it
        sys.stderr.write("engine_double: %s\n" % (fmt % args))

    def _json(self, status, body):
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _body(self):
        length = int(self.headers.get("Content-Length") or 0)
        if not length:
            return {}
        return json.loads(self.rfile.read(length).decode("utf-8"))

    def _debug(self, paths, dirs=None):
        env = dict((k, os.environ.get(k)) for k in ENV_KEYS)
        body = {"mounts": parse_mountinfo(), "env": env}
        if paths is not None:
            body["files"] = dict((p, file_info(p)) for p in paths)
        if dirs:
            body["dirs"] = dict((d, list_dir(d)) for d in dirs)
        return body

    def do_GET(self):
        path = urlparse(self.path).path
        if path == "/debug/mounts":
            return self._json(200, self._debug(None))
        if time.monotonic() < self.double.ready_at:
            return self._json(503, {"error": "loading"})
        if path == "/v1/models":
            return self._json(200, {"object": "list", "data": [
                {"id": self.double.model_id, "object": "model", "owned_by": "engine_double"}]})
        return self._json(404, {"error": "not found: %s" % path})

    def do_POST(self):
        path = urlparse(self.path).path
        try:
            body = self._body()
        except ValueError as exc:
            return self._json(400, {"error": "bad JSON: %s" % exc})
        if path == "/debug/mounts":
            return self._json(200, self._debug(list(body.get("paths") or []), list(body.get("dirs") or [])))
        if path == "/debug/try-write":
            return self._json(200, try_write(body.get("path", "")))
        if path == "/debug/switches":
            try:
                return self._json(200, self.double.set_switches(body))
            except (TypeError, ValueError) as exc:
                return self._json(400, {"error": str(exc)})
        if time.monotonic() < self.double.ready_at:
            return self._json(503, {"error": "loading"})
        if path != "/v1/chat/completions":
            return self._json(404, {"error": "not found: %s" % path})
        prompt = last_user_text(body.get("messages"))
        if body.get("stream"):
            return self._stream(body, prompt)
        text = answer(prompt)
        return self._json(200, {
            "id": "chatcmpl-double", "object": "chat.completion", "created": int(time.time()),
            "model": self.double.model_id,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": len(prompt.split()), "completion_tokens": len(text.split()),
                      "total_tokens": len(prompt.split()) + len(text.split())}})

    def _chunk(self, payload):
        data = b"data: " + payload + b"\n\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _stream(self, body, prompt):
        n_tokens = int(body.get("max_tokens") or 16)
        interval = 1.0 / self.double.tokens_per_s
        switches = dict(self.double.switches)
        finish, sent = "length", n_tokens
        if switches.get("short_after") is not None and switches["short_after"] < n_tokens:
            finish, sent = "stop", switches["short_after"]
        elif switches.get("length_after") is not None and switches["length_after"] < n_tokens:
            sent = switches["length_after"]
        cut = switches.get("cut_after") is not None and switches["cut_after"] < sent
        if cut:
            sent = switches["cut_after"]
        stall_s = switches.get("stall_s") or 0
        stall_after = switches.get("stall_after") or 0
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def chunk(delta, finish=None):
            return json.dumps({"id": "chatcmpl-double", "object": "chat.completion.chunk",
                               "model": self.double.model_id,
                               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}).encode()

        self._chunk(chunk({"role": "assistant"}))
        start = time.monotonic()
        paced = True
        for i in range(sent):
            if stall_s and i == stall_after:
                time.sleep(stall_s)
                paced = False  # the rest in one burst
            delay = start + i * interval - time.monotonic()
            if paced and delay > 0:
                time.sleep(delay)
            self._chunk(chunk({"content": " tok%d" % i}))
        if cut:
            # Like an engine dying mid-stream: the connection closes without ending the chunked body.
            sys.stderr.write("engine_double: stream cut after %d of %d tokens (cut_after)\n" % (sent, n_tokens))
            self.close_connection = True
            return
        self._chunk(chunk({}, finish))
        if (body.get("stream_options") or {}).get("include_usage") and not switches.get("no_usage"):
            self._chunk(json.dumps({"id": "chatcmpl-double", "object": "chat.completion.chunk", "choices": [],
                                    "usage": {"prompt_tokens": len(prompt.split()),
                                              "completion_tokens": sent,
                                              "total_tokens": len(prompt.split()) + sent}}).encode())
        self._chunk(b"[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def crash_after(seconds, code):
    """Exit the whole process with code after seconds, like an engine that crashes while serving."""
    def crash():
        sys.stderr.write("engine_double: RuntimeError: simulated crash after %g s (DOUBLE_EXIT_AFTER_S), "
                         "exit code %d\n" % (seconds, code))
        sys.stderr.flush()
        os._exit(code)

    timer = threading.Timer(seconds, crash)
    timer.daemon = True
    timer.start()
    return timer


class Server(ThreadingMixIn, HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def main(argv=None):
    parser = argparse.ArgumentParser(description="engine_double: test double of the inference engine")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=int(os.environ.get("DOUBLE_PORT", "8000")))
    args = parser.parse_args(argv)
    # PID 1 in a container gets no default SIGTERM action: exit promptly on stop.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

    parent = os.environ.get("DOUBLE_RECEIPT_PARENT", "/cache")
    names = [n for n in os.environ.get("DOUBLE_RECEIPT_ROOTS", "").split(",") if n]
    try:
        write_receipts(parent, names, os.environ.get("RANK"))
    except FileExistsError as exc:
        sys.stderr.write("FileExistsError: %s\n" % exc)
        sys.stderr.flush()
        return 1
    model_id = os.environ.get("DOUBLE_MODEL_ID") or "engine-double"
    Handler.double = Double(model_id, float(os.environ.get("DOUBLE_TOKENS_PER_S", "200")),
                            time.monotonic() + float(os.environ.get("DOUBLE_STARTUP_DELAY_S", "0")),
                            switches_from(os.environ))
    server = Server((args.host, args.port), Handler)
    sys.stderr.write("engine_double: serving on %s:%d (model %s, rank %s)\n"
                     % (args.host, args.port, model_id, os.environ.get("RANK")))
    sys.stderr.flush()
    if os.environ.get("DOUBLE_EXIT_AFTER_S"):
        crash_after(float(os.environ["DOUBLE_EXIT_AFTER_S"]), int(os.environ.get("DOUBLE_EXIT_CODE") or "1"))
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
