"""rollserve Python kernel: one persistent interpreter per session, served on a Unix socket.

Usage: python3 rollserve_kernel.py <socket path>

Protocol: newline-delimited JSON, both ways.
  -> {"id": 1, "code": "x = 1\\nx + 1", "max_output": 30000, "max_message": 1048576}
  <- {"id": 1, "status": "ok", "stdout": "", "stderr": "", "result": "2", "error": null}
  -> {"id": 2, "interrupt": true}      raises KeyboardInterrupt in the running cell (SIGINT)
Errors: "status": "error", "error": {"ename", "evalue", "traceback"}. Each text is capped at
max_output characters (head and tail), and a reply line at max_message bytes: the service ends a
sandbox whose kernel socket carries more.
Uses IPython's InteractiveShell when importable, plain exec otherwise (the value of a final
expression is returned, as in Jupyter). Prints "READY <mode>" on stdout once it listens.
"""

import ast
import json
import linecache
import os
import queue
import signal
import socket
import sys
import tempfile
import threading
import traceback

_running = threading.Event()


def _on_sigint(signum, frame):
    # only a running cell is interrupted; a late interrupt after the cell ended is dropped
    if _running.is_set():
        raise KeyboardInterrupt


def _cap(text, limit):
    if limit <= 0 or len(text) <= limit:
        return text
    half = limit // 2
    return "%s\n[... %d characters of output truncated ...]\n%s" % (
        text[:half],
        len(text) - 2 * half,
        text[-half:],
    )


class PlainShell:
    mode = "plain"

    def __init__(self):
        self.ns = {"__name__": "__main__", "__builtins__": __builtins__}
        self.count = 0

    def run(self, code):
        """Returns (result repr or None, error dict or None)."""
        self.count += 1
        filename = "<cell-%d>" % self.count
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        try:
            tree = ast.parse(code, filename, "exec")
        except (SyntaxError, ValueError, OverflowError) as exc:
            return None, _error(exc, with_traceback=False)
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        try:
            exec(compile(tree, filename, "exec"), self.ns)
            if last is not None:
                value = eval(compile(last, filename, "eval"), self.ns)
                if value is not None:
                    self.ns["_"] = value
                    return repr(value), None
            return None, None
        except BaseException as exc:  # noqa: B902 (SystemExit and KeyboardInterrupt are reported too)
            return None, _error(exc)


class IPythonShell:
    mode = "ipython"

    def __init__(self, **options):
        from IPython.core.interactiveshell import InteractiveShell

        self.shell = InteractiveShell.instance(colors="NoColor", **options)
        self.error = None
        hook = self.shell.displayhook
        hook.write_output_prompt = lambda: None
        hook.write_format_data = lambda *args, **kwargs: None
        # A cell's value is answered as its repr (run, below). IPython's formatters would compute
        # every MIME type of it for nothing, calling the object's _repr_html_, _repr_latex_, ...
        # (half of a short cell's time: ≈ 0.5 ms); `display()` still formats as it did.
        hook.compute_format_data = lambda result: ({}, {})

        def record(*args, **kwargs):
            etype, value, tb = sys.exc_info()
            if value is not None:
                self.error = _error(value, skip=0)

        self.shell.showtraceback = record
        self.shell.showsyntaxerror = record

    def run(self, code):
        self.error = None
        result = self.shell.run_cell(code, store_history=True)
        error = self.error
        if error is None:
            exc = result.error_before_exec or result.error_in_exec
            if exc is not None:
                error = _error(exc, with_traceback=False)
        value = None
        if error is None and result.result is not None:
            value = repr(result.result)
            # what the formatters would have logged, for `%history -o`
            self.shell.history_manager.output_hist_reprs[result.execution_count] = value
        return value, error


def _error(exc, with_traceback=True, skip=1):
    if not with_traceback:
        lines = traceback.format_exception_only(type(exc), exc)
        return {"ename": type(exc).__name__, "evalue": str(exc), "traceback": "".join(lines)}
    tb = exc.__traceback__
    for _ in range(skip):
        if tb is not None:
            tb = tb.tb_next
    te = traceback.TracebackException(type(exc), exc, tb)
    # the kernel's own frames (the SIGINT handler) are noise to the model
    te.stack = traceback.StackSummary.from_list([f for f in te.stack if f.filename != __file__])
    return {"ename": type(exc).__name__, "evalue": str(exc), "traceback": "".join(te.format())}


def _cap_error(error, limit):
    # an exception's message and traceback are the cell's to make as long as it likes
    if error is None:
        return None
    return {key: _cap(value, limit) if isinstance(value, str) else value for key, value in error.items()}


def _encode(message, max_bytes):
    """The reply as one line of at most `max_bytes` bytes (the service reads no longer one): its
    texts are halved until it fits, whatever their characters cost once JSON-escaped."""
    data = (json.dumps(message) + "\n").encode("utf-8")
    for _ in range(64):
        if max_bytes <= 0 or len(data) <= max_bytes:
            return data
        for key in ("stdout", "stderr", "result"):
            if isinstance(message.get(key), str):
                message[key] = _cap(message[key], len(message[key]) // 2)
        if message.get("error"):
            message["error"] = {
                key: _cap(value, len(value) // 2) if isinstance(value, str) else value for key, value in message["error"].items()
            }
        data = (json.dumps(message) + "\n").encode("utf-8")
    return data


def _make_shell():
    # ROLLSERVE_PYTHON_SHELL=plain skips IPython even where it is importable.
    if os.environ.get("ROLLSERVE_PYTHON_SHELL") == "plain":
        return PlainShell()
    try:
        return IPythonShell()
    except Exception:
        return PlainShell()


def _read_capped(f, limit):
    """A capture file's text, reading only its head and tail when it is large: a cell may have
    written gigabytes. A large one comes back within `limit` characters, so `_cap` leaves it."""
    size = f.seek(0, os.SEEK_END)
    # a UTF-8 character takes at most 4 bytes: 4 * limit bytes hold the `limit` characters kept
    room = 4 * limit
    f.seek(0)
    if limit <= 0 or size <= 2 * room:
        return f.read().decode("utf-8", "replace")
    keep = max(0, (limit - 80) // 2)
    head = f.read(room).decode("utf-8", "replace")[:keep]
    f.seek(size - room)
    tail = f.read(room).decode("utf-8", "replace")[-keep:] if keep else ""
    dropped = size - len(head.encode("utf-8")) - len(tail.encode("utf-8"))
    return "%s\n[... %d bytes of output truncated ...]\n%s" % (head, dropped, tail)


class Capture:
    """Redirects fds 1 and 2 to temporary files, so subprocess output is captured too."""

    def __init__(self, limit=0):
        self.limit = limit

    def __enter__(self):
        sys.stdout.flush()
        sys.stderr.flush()
        self.files = [tempfile.TemporaryFile(), tempfile.TemporaryFile()]
        self.saved = [os.dup(1), os.dup(2)]
        os.dup2(self.files[0].fileno(), 1)
        os.dup2(self.files[1].fileno(), 2)
        return self

    def __exit__(self, *exc):
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:
            pass
        os.dup2(self.saved[0], 1)
        os.dup2(self.saved[1], 2)
        for fd in self.saved:
            os.close(fd)
        self.text = []
        for f in self.files:
            self.text.append(_read_capped(f, self.limit))
            f.close()
        return False


def main():
    serve(sys.argv[1], _make_shell())


def _say_ready(mode):
    sys.stdout.write("READY %s\n" % mode)
    sys.stdout.flush()


def serve(path, shell, ready=_say_ready):
    """Serves `shell` on the Unix socket `path` until the process ends; `ready(mode)` once it
    listens (the fork server, rollserve_forkserver.py, calls this in each forked kernel)."""
    signal.signal(signal.SIGINT, _on_sigint)
    requests = queue.Queue()

    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    server.bind(path)
    server.listen(4)

    def serve(conn):
        lock = threading.Lock()

        def send(message, max_bytes=0):
            data = _encode(message, max_bytes)
            with lock:
                conn.sendall(data)

        buffer = b""
        while True:
            try:
                chunk = conn.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                if not line.strip():
                    continue
                try:
                    request = json.loads(line)
                except ValueError:
                    continue
                if request.get("interrupt"):
                    if _running.is_set():
                        os.kill(os.getpid(), signal.SIGINT)
                    continue
                requests.put((request, send))
        conn.close()

    def accept():
        while True:
            conn, _ = server.accept()
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    ready(shell.mode)

    while True:
        request, send = requests.get()
        code = request.get("code", "")
        limit = int(request.get("max_output", 30000))
        max_message = int(request.get("max_message", 0))
        result, error = None, None
        capture = Capture(limit)
        try:
            with capture:
                _running.set()
                try:
                    result, error = shell.run(code)
                finally:
                    _running.clear()
        except KeyboardInterrupt as exc:
            # landed between the cell's end and the flag being cleared
            error = _error(exc, with_traceback=False)
        stdout, stderr = getattr(capture, "text", ("", ""))
        try:
            send(
                {
                    "id": request.get("id"),
                    "status": "error" if error else "ok",
                    "stdout": _cap(stdout, limit),
                    "stderr": _cap(stderr, limit),
                    "result": _cap(result, limit) if result is not None else None,
                    "error": _cap_error(error, limit),
                },
                max_message,
            )
        except OSError:
            pass


if __name__ == "__main__":
    main()
