"""HTTP/1.1 over http.client: a keep-alive connection per thread, retries with backoff, the
service's error bodies as RolloutServiceError, and the NDJSON result stream read by threads."""

from __future__ import annotations

import http.client
import json
import random
import socket
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple
from urllib.parse import quote, urlencode, urlsplit

from .errors import RolloutServiceError, ServiceConnectionError

_STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)
_NETWORK = (OSError, http.client.HTTPException)


def _error_from(status: int, data: bytes, method: str, path: str, url: str = "") -> RolloutServiceError:
    try:
        body = json.loads(data)
        err = body["error"] if isinstance(body, dict) and isinstance(body.get("error"), dict) else None
    except ValueError:
        body, err = None, None
    if err is None:
        # Not the rollout service's error shape: say where the answer came from, and what it
        # likely is (FastAPI's {"detail": ...}: an environment's resources server, a NeMo Gym or
        # ProRL server, on the port meant for the rollout service).
        text = data.decode("utf-8", "replace").strip()[:500] or http.client.responses.get(status, "")
        where = f" from {url.rstrip('/')}{path}" if url else ""
        hint = ""
        if isinstance(body, dict) and "detail" in body:
            hint = (
                f"; {url or 'this URL'} answers as a FastAPI server (an environment's resources server, NeMo Gym or ProRL?),"
                " not as the rollserve rollout service: point the client at the service (`rollserve start` serves it, port 8100 by default)"
            )
        elif status == 404:
            hint = f"; is {url or 'this URL'} the rollserve rollout service (`rollserve start`, port 8100 by default)?"
        return RolloutServiceError(status, f"HTTP_{status}", f"{text}{where}{hint}", method=method, path=path)
    return RolloutServiceError(
        status,
        str(err.get("code", f"HTTP_{status}")),
        str(err.get("message", "")),
        retryable=bool(err.get("retryable", False)),
        details=err.get("details"),
        method=method,
        path=path,
    )


class Transport:
    def __init__(
        self,
        url: str,
        token: Optional[str] = None,
        timeout: Optional[float] = 60.0,
        retries: int = 5,
        backoff: float = 0.25,
        backoff_max: float = 8.0,
        stream_timeout: Optional[float] = None,
    ) -> None:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.url = url
        self.https = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.https else 80)
        self.base = parts.path.rstrip("/")
        self.timeout = timeout
        self.stream_timeout = stream_timeout
        self.retries = retries
        self.backoff = backoff
        self.backoff_max = backoff_max
        self.headers: Dict[str, str] = {"accept": "application/json", "user-agent": "rollserve-python/0.1"}
        if token:
            self.headers["authorization"] = f"Bearer {token}"
        self._local = threading.local()
        self._lock = threading.Lock()
        self._conns: Set[http.client.HTTPConnection] = set()
        self.closed = False

    # connections ---------------------------------------------------------------------------

    def new_connection(self, timeout: Optional[float]) -> http.client.HTTPConnection:
        if self.https:
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self.new_connection(self.timeout)
            self._local.conn = conn
            with self._lock:
                self._conns.add(conn)
        return conn

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            self._local.conn = None
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def close(self) -> None:
        self.closed = True
        with self._lock:
            conns, self._conns = list(self._conns), set()
        for conn in conns:
            conn.close()

    def delay(self, attempt: int) -> float:
        return min(self.backoff_max, self.backoff * (2**attempt)) * (0.5 + random.random() / 2)

    def path(self, path: str, query: Optional[Mapping[str, Any]] = None) -> str:
        full = self.base + path
        if query:
            items = [(k, v) for k, v in query.items() if v is not None]
            if items:
                full += "?" + urlencode(items, safe=",:")
        return full

    # requests ------------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: Optional[Mapping[str, Any]] = None,
        retry: bool = True,
        timeout: Optional[float] = None,
    ) -> Any:
        """One JSON call. With ``retry``, connection errors, timeouts and 5xx answers are tried
        again with backoff (only for calls safe to repeat). A keep-alive connection the server
        closed meanwhile is always retried once, at once, on a new one."""
        if self.closed:
            raise RuntimeError("the client is closed")
        target = self.path(path, query)
        headers = dict(self.headers)
        payload: Optional[bytes] = None
        if body is not None:
            payload = json.dumps(body, separators=(",", ":")).encode()
            headers["content-type"] = "application/json"
        attempt = 0
        stale_retried = False
        while True:
            conn = self._connection()
            reused = conn.sock is not None
            if timeout is not None and conn.sock is not None:
                conn.sock.settimeout(timeout)
            conn.timeout = timeout if timeout is not None else self.timeout
            try:
                conn.request(method, target, body=payload, headers=headers)
                response = conn.getresponse()
                data = response.read()
            except _NETWORK as error:
                self._drop()
                if reused and not stale_retried and isinstance(error, _STALE):
                    stale_retried = True
                    continue
                if retry and attempt < self.retries:
                    time.sleep(self.delay(attempt))
                    attempt += 1
                    continue
                raise ServiceConnectionError(f"{type(error).__name__}: {error} ({self.url})", method=method, path=path) from error
            finally:
                if timeout is not None and conn.sock is not None:
                    conn.sock.settimeout(self.timeout)
                    conn.timeout = self.timeout
            if response.will_close:
                self._drop()
            status = response.status
            if status >= 500 and retry and attempt < self.retries:
                time.sleep(self.delay(attempt))
                attempt += 1
                continue
            if status >= 400:
                raise _error_from(status, data, method, path, self.url)
            if not data:
                return None
            try:
                return json.loads(data)
            except ValueError as error:
                raise RolloutServiceError(status, "PROTOCOL", f"the answer is not JSON: {data[:200]!r}", method=method, path=path) from error

    def open_stream(self, ids: Sequence[str], view: Optional[str] = None, max_response_tokens: Optional[int] = None, max_staleness: Optional[int] = None) -> Tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """One attempt at the NDJSON stream of ``ids``; the caller retries. A short list goes
        in the query string (``GET /v1/rollouts/stream?ids=...``); a long one in a JSON body
        (``POST /v1/rollouts/stream``), which takes any number of ids where a query string past
        the server's header limit is refused (HTTP 431)."""
        conn = self.new_connection(self.stream_timeout)
        headers = dict(self.headers)
        headers["accept"] = "application/x-ndjson"
        joined = ",".join(ids)
        extra: Dict[str, Any] = {**({"view": view} if view else {}), **({"max_response_tokens": max_response_tokens} if max_response_tokens is not None else {})}
        # a staleness bound flags stale results (`stale`); the client leaves them out itself when
        # asked to, so that what it waits for still arrives
        bound = {} if max_staleness is None else {"max_staleness": str(max_staleness)}
        if len(quote(joined, safe=",:")) <= MAX_IDS_CHARS:
            method, target, payload = "GET", self.path("/v1/rollouts/stream", {"ids": joined, "format": "ndjson", **extra, **bound}), None
        else:
            body = {"ids": list(ids), "format": "ndjson", **extra, **({} if max_staleness is None else {"staleness": {"max_versions": max_staleness}})}
            method, target, payload = "POST", self.path("/v1/rollouts/stream"), json.dumps(body, separators=(",", ":")).encode()
            headers["content-type"] = "application/json"
        try:
            conn.request(method, target, body=payload, headers=headers)
            response = conn.getresponse()
        except BaseException:
            conn.close()
            raise
        if response.status != 200:
            data = response.read()
            conn.close()
            raise _error_from(response.status, data, method, "/v1/rollouts/stream", self.url)
        return conn, response

    def open_sampling_stream(self, id: str, view: Optional[str] = None, max_response_tokens: Optional[int] = None) -> Tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """One attempt at the NDJSON stream of a dynamic sampling's kept groups; the caller retries."""
        conn = self.new_connection(self.stream_timeout)
        headers = dict(self.headers)
        headers["accept"] = "application/x-ndjson"
        path = f"/v1/rollouts/sampling/{quote(id, safe=':')}/stream"
        query: Dict[str, Any] = {"format": "ndjson", **({"view": view} if view else {}), **({"max_response_tokens": max_response_tokens} if max_response_tokens is not None else {})}
        try:
            conn.request("GET", self.path(path, query), headers=headers)
            response = conn.getresponse()
        except BaseException:
            conn.close()
            raise
        if response.status != 200:
            data = response.read()
            conn.close()
            raise _error_from(response.status, data, "GET", path, self.url)
        return conn, response


# The stream ----------------------------------------------------------------------------------

# Ids up to this many characters go in the query string (Node's default header limit is 16 KiB);
# more go in a POST body.
MAX_IDS_CHARS = 6000

Emit = Callable[[Tuple[str, Any]], None]


class ResultStream:
    """Reads results of ``ids`` (rollout or task ids) from an NDJSON stream, in a thread of its
    own, and hands each result once to ``emit`` as ``("result", dict)``; then ``("done", None)``
    once the service has ended it, or ``("error", exc)``. Blank lines (the service's keep-alives
    on an idle stream) are skipped.
    A dropped connection is reopened (with backoff; ``retries`` failures in a row without a new
    result give up) and results seen before are skipped."""

    def __init__(self, transport: Transport, ids: Sequence[str], emit: Emit, view: Optional[str] = None, max_response_tokens: Optional[int] = None, max_staleness: Optional[int] = None) -> None:
        self.transport = transport
        self.emit = emit
        self.view = view
        self.max_response_tokens = max_response_tokens
        self.max_staleness = max_staleness
        unique = list(dict.fromkeys(ids))
        if not unique:
            raise ValueError("iter_results needs at least one id")
        self.chunks = [unique]
        self.seen: Set[str] = set()
        self.reconnects = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._open: Set[http.client.HTTPConnection] = set()
        self._threads: List[threading.Thread] = []

    def start(self) -> "ResultStream":
        for i, chunk in enumerate(self.chunks):
            thread = threading.Thread(target=self._run, args=(chunk,), name=f"rollserve-stream-{i}", daemon=True)
            self._threads.append(thread)
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            conns = list(self._open)
        for conn in conns:
            sock = conn.sock
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            conn.close()

    def _run(self, chunk: List[str]) -> None:
        pending = list(chunk)
        failures = 0
        try:
            while not self._stop.is_set():
                with self._lock:
                    pending = [i for i in pending if i not in self.seen]
                if not pending:
                    break
                conn: Optional[http.client.HTTPConnection] = None
                try:
                    conn, response = self.transport.open_stream(pending, self.view, self.max_response_tokens, self.max_staleness)
                    with self._lock:
                        self._open.add(conn)
                    if self._stop.is_set():
                        break
                    buffered = b""
                    while True:
                        # Blocks of what has arrived, split here: far fewer calls than readline.
                        block = response.read1(65536)
                        if not block:
                            if buffered.strip():  # a line cut short: the stream did not end cleanly
                                raise http.client.IncompleteRead(buffered)
                            return self._done()
                        *lines, buffered = (buffered + block).split(b"\n")
                        for line in lines:
                            if not line.strip():
                                continue
                            result = json.loads(line)
                            with self._lock:
                                if result["id"] in self.seen:
                                    continue
                                self.seen.add(result["id"])
                            failures = 0
                            self.emit(("result", result))
                except RolloutServiceError as error:
                    if error.status is None or error.status < 500 or failures >= self.transport.retries:
                        raise
                except _NETWORK as error:
                    if self._stop.is_set():
                        return
                    if failures >= self.transport.retries:
                        raise ServiceConnectionError(f"the result stream dropped: {type(error).__name__}: {error}", method="GET", path="/v1/rollouts/stream") from error
                finally:
                    if conn is not None:
                        with self._lock:
                            self._open.discard(conn)
                        conn.close()
                if self._stop.is_set():
                    return
                with self._lock:
                    self.reconnects += 1
                time.sleep(self.transport.delay(failures))
                failures += 1
            self._done()
        except BaseException as error:  # noqa: BLE001 - handed to the consumer
            if not self._stop.is_set():
                self.emit(("error", error))

    def _done(self) -> None:
        if not self._stop.is_set():
            self.emit(("done", None))
