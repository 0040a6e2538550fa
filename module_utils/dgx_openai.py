"""A client of the engine's OpenAI-style API with a whole-request deadline. The
opener and the clock are arguments, so tests drive them."""
import contextlib
import json
import socket
import threading
import time

from ansible.module_utils.dgx_errors import StageError
from ansible.module_utils.dgx_units import plain_number
from http import client as http_client
from urllib.error import HTTPError, URLError
from urllib.request import HTTPHandler, HTTPSHandler, Request, build_opener, urlopen


def api_url(base, path):
    """Join the API base (http://host:port, with or without a trailing / or /v1) and a /v1 path."""
    base = (base or "").rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise StageError("engine API url %r must start with http:// or https://" % (base,))
    if base.endswith("/v1") and path.startswith("/v1/"):
        base = base[:-3]
    return base + path


def chat_payload(model, prompt, max_tokens, stream=False):
    """A temperature-0 chat completion body. A stream asks for usage and ignore_eos (SGLang, vLLM): a model that
    ends its answer early would make a healthy engine fail the max_tokens check."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": int(max_tokens), "temperature": 0, "stream": bool(stream)}
    if stream:
        body.update(stream_options={"include_usage": True}, ignore_eos=True)
    return body


def first_model_id(models_body):
    """The first model id served, from a /v1/models response body."""
    data = (models_body or {}).get("data") or []
    if not data or not isinstance(data[0], dict) or not data[0].get("id"):
        raise StageError("/v1/models lists no model (%s); set engine_served_model"
                         % json.dumps(models_body)[:200])
    return data[0]["id"]


def completion_text(body):
    """The assistant text of a non-stream completion: content plus any reasoning_content."""
    try:
        message = body["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        raise StageError("chat completion without choices[0].message: %s" % json.dumps(body)[:300])
    parts = [message.get("reasoning_content"), message.get("content")]
    return "".join(p for p in parts if isinstance(p, str))


def parse_sse(timed_lines):
    """{"chunks", "t_first", "t_last", "usage", "text", "finish_reason", "done"} of (arrival time, raw line)
    pairs; a malformed event raises StageError quoting it."""
    out = {"chunks": 0, "t_first": None, "t_last": None, "usage": None, "text": "",
           "finish_reason": None, "done": False}
    pieces = []
    for when, raw in timed_lines:
        line = (raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw).strip()
        if not line.startswith("data:"):
            continue  # blank separators, ": keep-alive" comments, "event:" lines
        data = line[5:].strip()
        if data == "[DONE]":
            out["done"] = True
            break
        try:
            event = json.loads(data)
        except ValueError:
            raise StageError("stream event is not JSON: %r" % data[:200])
        if not isinstance(event, dict):
            raise StageError("stream event is not a JSON object: %r" % data[:200])
        if event.get("error"):
            raise StageError("the engine reported an error mid-stream: %s" % json.dumps(event["error"])[:300])
        if isinstance(event.get("usage"), dict) and event["usage"]:
            out["usage"] = event["usage"]
        choices = event.get("choices") or []
        if not isinstance(choices, list) or not all(isinstance(choice, dict) for choice in choices):
            raise StageError("stream event has choices that are not a list of objects: %r" % data[:200])
        # Only choice 0's tokens are the answer's.
        for choice in [choice for choice in choices if choice.get("index", 0) == 0][:1]:
            delta = choice.get("delta") or {}
            parts = [delta.get(k) or "" for k in ("reasoning_content", "content")] if isinstance(delta, dict) else [0]
            if not all(isinstance(part, str) for part in parts):
                raise StageError("stream event has a delta whose content is not text: %r" % data[:200])
            text = "".join(parts)
            # The answer ends at its finish reason: text after it is not the answer's.
            if text and out["finish_reason"] is None:
                out["chunks"] += 1
                if out["t_first"] is None:
                    out["t_first"] = when
                out["t_last"] = when
                pieces.append(text)
            if choice.get("finish_reason") and out["finish_reason"] is None:
                out["finish_reason"] = choice["finish_reason"]
    out["text"] = "".join(pieces)
    return out


def stream_tokens(stream):
    """(tokens, token_source) of a parse_sse() stream: the server's usage count when it is a whole positive
    number (a chunk may carry several tokens), else the token-bearing chunks, a count that can only be low."""
    completion_tokens = (stream.get("usage") or {}).get("completion_tokens")
    if isinstance(completion_tokens, int) and not isinstance(completion_tokens, bool) and completion_tokens > 0:
        return completion_tokens, "usage"
    return stream["chunks"], "chunks"


def _describe(exc):
    if isinstance(exc, HTTPError):
        try:
            detail = exc.read()[:200].decode("utf-8", "replace")
        except Exception:  # pylint: disable=broad-except
            detail = ""
        return "HTTP %d %s" % (exc.code, detail)
    if isinstance(exc, URLError):
        return "unreachable (%s)" % (exc.reason,)
    return "%s: %s" % (type(exc).__name__, exc)


def _too_long(timeout):
    return "the whole request took longer than %s s (engine_request_timeout)" % plain_number(timeout)


class _Deadline(object):
    """A request's whole time: at its deadline the watched sockets are shut down, which ends a read blocked on a
    server trickling its headers or body (a socket timeout bounds each read only); check() looks at the clock
    between reads (responses without a socket, in tests)."""

    def __init__(self, timeout, clock):
        self.timeout, self.clock, self.deadline = timeout, clock, clock() + timeout
        self.fired, self.socks = False, []
        self.timer = threading.Timer(timeout, self.fire)
        self.timer.daemon = True
        self.timer.start()

    def watch(self, sock):
        # fire() sets fired before it copies socks: a sock it misses sees fired here.
        self.socks.append(sock)
        if self.fired:
            self.fire()

    def fire(self):
        self.fired = True
        for sock in list(self.socks):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def check(self):
        if self.fired or self.clock() >= self.deadline:
            self.fired = True
            raise socket.timeout(_too_long(self.timeout))


class _WatchedHandler(HTTPHandler, HTTPSHandler):
    """Both handlers in one, so it replaces urllib's defaults and no https URL slips past the deadline; a
    connection is watched from its connect (HTTPS: once its handshake is done)."""

    def __init__(self, deadline):
        HTTPSHandler.__init__(self)
        self._deadline = deadline

    def _watched(self, connection):
        deadline = self._deadline

        class Watched(connection):
            def connect(self):
                connection.connect(self)
                deadline.watch(self.sock)
        return Watched

    def http_open(self, req):
        return self.do_open(self._watched(http_client.HTTPConnection), req)

    def https_open(self, req):
        return self.do_open(self._watched(http_client.HTTPSConnection), req, context=self._context)


@contextlib.contextmanager
def open_within(opener, url, payload, timeout, clock):
    """(response, its _Deadline) of a GET, or with payload a POST of it as JSON, the deadline counting from now."""
    headers = {"Accept": "application/json"}
    if payload is not None:
        headers["Content-Type"] = "application/json"
        payload = json.dumps(payload).encode("utf-8")
    request = Request(url, data=payload, headers=headers)
    limit = _Deadline(timeout, clock)
    try:
        try:
            if opener is urlopen:
                resp = build_opener(_WatchedHandler(limit)).open(request, timeout=timeout)
            else:
                resp = opener(request, timeout=timeout)
        except (http_client.HTTPException, OSError) as exc:
            if limit.fired and not isinstance(exc, HTTPError):
                raise socket.timeout(_too_long(timeout))
            raise
        with resp:
            yield resp, limit
    finally:
        limit.timer.cancel()


def request_failed(method, url, exc):
    return StageError("%s %s failed: %s" % (method, url, _describe(exc)))


def http_json(url, payload=None, timeout=300.0, opener=urlopen, clock=time.monotonic):
    """GET (payload None) or POST JSON, the decoded body; StageError otherwise. timeout is the whole request's."""
    method, cut = "POST" if payload is not None else "GET", {"reason": None}
    try:
        with open_within(opener, url, payload, timeout, clock) as (resp, limit):
            raw = b"".join(line for _when, line in timed_lines(resp, clock, cut, limit))
    except (http_client.HTTPException, OSError) as exc:
        raise request_failed(method, url, exc)
    if cut["reason"]:
        raise StageError("%s %s failed: %s" % (method, url, cut["reason"]))
    try:
        return json.loads(raw.decode("utf-8"))
    except ValueError:
        raise StageError("%s answered with non-JSON: %r" % (url, raw[:200]))


def timed_lines(resp, clock, cut, limit):
    """(arrival time, line) of a streamed response; a connection that breaks or a stream still going at limit's
    deadline ends the lines, noted in cut["reason"]."""
    while True:
        try:
            limit.check()
            line = resp.readline()
            if limit.fired:
                limit.check()
        except (http_client.HTTPException, OSError) as exc:
            cut["reason"] = _too_long(limit.timeout) if limit.fired else _describe(exc)
            return
        if not line:
            # http.client hides a chunked body cut before its last chunk; chunk_left is None only after it.
            if getattr(resp, "chunked", False) and getattr(resp, "chunk_left", None) is not None:
                cut["reason"] = "closed before the end of the chunked body"
            return
        yield clock(), line
