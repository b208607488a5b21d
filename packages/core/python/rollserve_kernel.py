"""rollserve Python kernel: one persistent interpreter per session, served on a Unix socket.

Usage: python3 rollserve_kernel.py <socket path>

Protocol: newline-delimited JSON, both ways.
  -> {"id": 1, "code": "x = 1\\nx + 1", "max_output": 30000, "max_message": 1048576}
  <- {"id": 1, "status": "ok", "stdout": "", "stderr": "", "result": "2", "error": null}
  -> {"id": 2, "interrupt": true}      raises KeyboardInterrupt in the running cell (as SIGINT does)
Errors: "status": "error", "error": {"ename", "evalue", "traceback"}. Each text is capped at
max_output characters (head and tail), and a reply line at max_message bytes: the service ends a
sandbox whose kernel socket carries more.
Uses IPython's InteractiveShell when importable, plain exec otherwise (the value of a final
expression is returned, as in Jupyter). Prints "READY <mode>" on stdout once it listens.
"""

import ast
import collections
import fcntl
import json
import linecache
import os
import signal
import socket
import sys
import tempfile
import traceback

# whether a cell runs (a list: the flag is read in signal handlers, set in the main loop)
_running = [False]


def _on_sigint(signum, frame):
    # only a running cell is interrupted; a late interrupt after the cell ended is dropped
    if _running[0]:
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


def _import_preload(names):
    """PythonKernelOptions.preload in a spawned kernel: imported before the first cell (a forked
    kernel's server imported them); a module this interpreter lacks is left out."""
    import importlib

    for name in names.split(","):
        if name:
            try:
                importlib.import_module(name)
            except ImportError:
                pass


def main():
    _import_preload(os.environ.pop("ROLLSERVE_PYTHON_PRELOAD", ""))
    serve(sys.argv[1], _make_shell())


def _say_ready(mode):
    sys.stdout.write("READY %s\n" % mode)
    sys.stdout.flush()


class _Connection:
    """The service's connection. The kernel has no thread of its own: requests are read by the
    main loop between cells and, while a cell runs, by the SIGIO handler, which raises
    KeyboardInterrupt in the cell when it reads an interrupt (as SIGINT does). A thread to read
    them would cost every kernel ≈ 1 ms of CPU and ≈ 120 copy-on-write faults to start in a fork."""

    def __init__(self, conn):
        self.conn = conn
        # a cell's fork that returns from the cell is not the kernel: it must not serve
        self.pid = os.getpid()
        self.buffer = b""
        self.requests = collections.deque()
        self.closed = False
        # a read in progress in the main loop, which the handler leaves to it
        self.busy = False

    def _parse(self):
        """Queues the complete lines read; True if one was an interrupt (which is not queued)."""
        interrupted = False
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            if not line.strip():
                continue
            try:
                request = json.loads(line)
            except ValueError:
                continue
            if not isinstance(request, dict):
                continue
            if request.get("interrupt"):
                interrupted = True
            else:
                self.requests.append(request)
        return interrupted

    def _read(self, block):
        """Reads what the socket holds (waiting for something first if `block`); True if an
        interrupt came."""
        interrupted = False
        flags = 0 if block else socket.MSG_DONTWAIT
        while not self.closed:
            try:
                chunk = self.conn.recv(65536, flags)
            except BlockingIOError:
                break
            except OSError:
                chunk = b""
            if not chunk:
                self.closed = True
                break
            self.buffer += chunk
            interrupted = self._parse() or interrupted
            flags = socket.MSG_DONTWAIT
        return interrupted

    def on_sigio(self, signum, frame):
        if self.busy or os.getpid() != self.pid:
            return
        self.busy = True
        try:
            interrupted = self._read(False)
        finally:
            self.busy = False
        # only a running cell is interrupted; a late interrupt after the cell ended is dropped
        if interrupted and _running[0]:
            raise KeyboardInterrupt

    def arm(self):
        """As a cell starts: an interrupt that came before SIGIO could tell it interrupts it now."""
        self.on_sigio(signal.SIGIO, None)

    def next(self):
        """The next request, waiting for it; None once the service's connection ended."""
        # set before the queue is looked at: a handler run from here on leaves the reading to this loop
        self.busy = True
        try:
            while not self.requests and not self.closed:
                self._read(True)
            return self.requests.popleft() if self.requests else None
        finally:
            self.busy = False

    def send(self, message, max_bytes=0):
        self.conn.sendall(_encode(message, max_bytes))


def _end_fork():
    """The cell forked and this is the fork, back from the cell: what it printed goes to the
    cell's output (flushed), and it ends before it touches the capture files it shares with the
    kernel (their offsets are shared too) or the socket: the kernel answers the cell, not it."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(0)


def serve(path, shell, ready=_say_ready):
    """Serves `shell` on the Unix socket `path` until the process ends; `ready(mode)` once it
    listens (the fork server, rollserve_forkserver.py, calls this in each forked kernel). The
    service's connection is the only one it serves."""
    signal.signal(signal.SIGINT, _on_sigint)

    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    server.bind(path)
    server.listen(1)
    ready(shell.mode)
    conn, _ = server.accept()
    server.close()
    connection = _Connection(conn)
    signal.signal(signal.SIGIO, connection.on_sigio)
    fcntl.fcntl(conn.fileno(), fcntl.F_SETOWN, os.getpid())
    fcntl.fcntl(conn.fileno(), fcntl.F_SETFL, fcntl.fcntl(conn.fileno(), fcntl.F_GETFL) | os.O_ASYNC)

    while True:
        request = connection.next()
        if request is None:
            # the service is gone: it ends this process
            while True:
                signal.pause()
        code = request.get("code", "")
        limit = int(request.get("max_output", 30000))
        max_message = int(request.get("max_message", 0))
        result, error = None, None
        capture = Capture(limit)
        try:
            with capture:
                _running[0] = True
                try:
                    connection.arm()
                    result, error = shell.run(code)
                finally:
                    _running[0] = False
                    if os.getpid() != connection.pid:
                        _end_fork()
        except KeyboardInterrupt as exc:
            # landed before the cell began or between its end and the flag being cleared
            error = _error(exc, with_traceback=False)
        stdout, stderr = getattr(capture, "text", ("", ""))
        try:
            connection.send(
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
