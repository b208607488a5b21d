"""rollserve kernel fork server: an interpreter that has imported the kernel (and IPython) once and
forks a kernel into a running sandbox per request, so no sandbox pays the import.

Started by the service (sandbox/bwrap/fork-server.ts) as `python3 -s -c <loader>`, the loader
reading this file and the kernel's source from fd 3. It runs on the host, as the service, and
never runs code of a sandbox: each request is served by a fork that enters the sandbox as an
entering process would (nsenter -U -m -p ..., after joining its cgroup and, for a root service,
dropping to the sandbox uid), drops every capability it gained there, sets the sandbox's limits,
and only then becomes the kernel. What a kernel shares with the fork server is the fork server's
pristine memory, copied on write; nothing flows back.

Protocol on stdin/stdout, one JSON object a line:
  -> {"id": 1, "init": 1234, "pidns": 4026532256, "ns": ["net", ...], "cgroup_procs": [...],
      "user": [65534, 65534] | null, "rlimits": {...}, "cwd": "/workspace", "env": {...},
      "socket": "/run/rollserve/py-x.sock", "plain": false}
  <- {"id": 1, "pid": 5678, "mode": "ipython"}      or {"id": 1, "error": "..."}
  <- {"exit": 5678, "code": 137}                     a kernel ended (the server reaps them)
  -> {"kill": 5678}                                  SIGKILLs a kernel's process group
A request with "exec": [argv...] and "tty": {"fd": 12, "cols": 200, "rows": 50} instead runs a
program on the service's pseudo-terminal (its master descriptor `fd`): entered as a kernel is,
it execs argv with the terminal's other side as its controlling terminal and 0-2 (a root service
only: the fork takes the master from the service with pidfd_getfd, which needs CAP_SYS_PTRACE).

A bare server whose preload module names a `host` function has a grader: a process forked from
the server before any request (so it holds nothing of any sandbox's), which stays on the host and
never enters a sandbox, so what it is given never reaches one. A program request with
"channel": true gets the write end of a pipe at its descriptor 3; the read end goes to the grader
(SCM_RIGHTS over a socket pair), never through the server's own memory. The service then sends the
grader, on a pipe of its own (the server's fds 4 and 5, which the grader keeps and the server
closes):
  -> {"id": 1, "data": ...}     what `host(data)` grades the channel with (a generator sent the
                                channel's bytes as they come, returning the answer)
  <- {"id": 1, "result": ...}   or {"id": 1, "error": "..."}: its answer, once
  -> {"drop": 1}                a channel the service will send nothing for, or no longer waits for
The grader grades nothing itself: once it has a channel's descriptor and data it forks a process
for that channel alone (holding no other channel's descriptor or data; the data is decoded there,
the grader reads only its id), which grades it under its own CPU and address-space rlimits and
hands its answer back whole on a pipe of its own, for the grader to write on: one channel's grading
(a flood's decoding, a slow comparison) never delays another's answer, and answers never
interleave.
"""

import ctypes
import errno
import gc
import json
import os
import select
import shutil
import signal
import sys
import tempfile
import time

INPUT_MOUNT = "/run/rollserve-in"

libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWPID = 0x20000000
MADV_COLLAPSE = 25
PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SYS_PIDFD_OPEN = 434  # the same number on every architecture
SYS_PIDFD_GETFD = 438
TIOCSPTLCK = 0x40045431
TIOCGPTPEER = 0x5441
LINUX_CAPABILITY_VERSION_3 = 0x20080522
# nsenter's order: the user namespace first (it gives the capabilities to enter the rest), the
# mount namespace last (the other namespaces' files are opened through the host's /proc)
NS_ORDER = ["user", "cgroup", "ipc", "uts", "net", "pid", "mnt"]
RLIMITS = {
    "as": "RLIMIT_AS",
    "fsize": "RLIMIT_FSIZE",
    "cpu": "RLIMIT_CPU",
    "nofile": "RLIMIT_NOFILE",
    "nproc": "RLIMIT_NPROC",
    "core": "RLIMIT_CORE",
}

try:
    with open("/proc/sys/kernel/cap_last_cap") as f:
        CAP_LAST = int(f.read())
except OSError:
    CAP_LAST = 63


def _check(result, what):
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, "%s: %s" % (what, os.strerror(err)))


def _prctl(option, arg=0):
    _check(libc.prctl(option, ctypes.c_ulong(arg), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)), "prctl %d" % option)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _drop_capabilities():
    """Entering a user namespace gives every capability in it; an entering process exec()s as a
    non-root uid and so loses them, a fork has to give them up itself."""
    for cap in range(CAP_LAST + 1):
        _prctl(PR_CAPBSET_DROP, cap)
    _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    header = _CapHeader(LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(libc.capset(ctypes.byref(header), data), "capset")


def _load_kernel(source):
    """The kernel as a module named as the spawned kernel's file would be inside (no host path shows)."""
    import types

    module = types.ModuleType("rollserve_kernel")
    module.__file__ = INPUT_MOUNT + "/rollserve_kernel.py"
    sys.modules["rollserve_kernel"] = module
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module


def _prepare_ipython(kernel):
    """An InteractiveShell made, warmed on a cell of its own and reset, ready to be forked.
    History is kept in memory (a database file would be one file shared by every fork), and
    IPython's directory, made at start, lives in a directory removed at once: each kernel makes
    its own in the sandbox (see _adopt_ipython)."""
    try:
        from traitlets.config import Config
    except Exception:
        return None
    # named by this process: a server killed meanwhile leaves it to the service's sweep (staging.ts)
    home = tempfile.mkdtemp(prefix="rollserve-forkserver-%d-" % os.getpid())
    saved = os.environ.get("IPYTHONDIR")
    os.environ["IPYTHONDIR"] = home
    try:
        config = Config()
        config.HistoryManager.hist_file = ":memory:"
        shell = kernel.IPythonShell(config=config)
        # the first cell pays for lazily made parts (compiler, display formatters, traceback)
        shell.run("_rollserve_warm = 1\n_rollserve_warm")
        shell.run("raise ValueError('warm')")
        shell.shell.reset(new_session=True)
        return shell
    except Exception:
        return None
    finally:
        if saved is None:
            os.environ.pop("IPYTHONDIR", None)
        else:
            os.environ["IPYTHONDIR"] = saved
        shutil.rmtree(home, ignore_errors=True)


def _adopt_ipython(shell):
    """The forked shell takes the sandbox's places: its directory history, IPython's directory
    (made as InteractiveShell makes it, without its observers' cost: ≈ 4 ms a kernel)."""
    from IPython.paths import get_ipython_dir

    ipython = shell.shell
    ipython.history_manager.dir_hist[:] = [os.getcwd()]
    try:
        home = get_ipython_dir()
        profile = ipython.profile_dir
        location = os.path.join(home, "profile_default")
        os.makedirs(location, exist_ok=True)
        ipython._trait_values["ipython_dir"] = home
        profile._trait_values["location"] = location
        for name in ("security", "log", "startup", "pid", "static"):
            profile._trait_values[name + "_dir"] = os.path.join(location, getattr(profile, name + "_dir_name"))
        profile.check_dirs()
    except Exception:
        pass  # an unwritable HOME: the spawned kernel would have warned and gone on as well


class Server:
    def __init__(self, kernel, ipython):
        self.kernel = kernel
        self.ipython = ipython
        # kernels not yet reaped (their pids are theirs), and those whose start failed
        self.kernels = set()
        self.ended = set()
        self.early = {}  # exit codes of kernels reaped while their start was pending
        self.starting = {}  # status pipe fd -> [request id, bytes, kernel pid]
        self.root = os.geteuid() == 0
        self.out = bytearray()
        # the server's end of the socket pair to its grader (None: no grader)
        self.grader = None
        self.channels = {}  # status pipe fd -> channel id, until the start is reported

    def send(self, message):
        self.out += (json.dumps(message) + "\n").encode()
        while self.out:
            try:
                n = os.write(1, self.out)
            except BlockingIOError:
                select.select([], [1], [])
                continue
            del self.out[:n]

    def start(self, request):
        channel = None
        if request.get("channel"):
            if self.grader is None or request.get("run") is None:
                self.send({"id": request.get("id"), "error": "no grader for a channel"})
                return
            channel = os.pipe()
        r, w = os.pipe()

        def child():
            os.close(r)
            if channel is not None:
                os.close(channel[0])
            _enter(request, w, self.kernel, self.ipython, in_pidns=self.root, channel=None if channel is None else channel[1])

        try:
            pid = _fork_in_pidns(int(request["init"]), int(request["pidns"]), child) if self.root else os.fork()
        except OSError as exc:
            os.close(r)
            os.close(w)
            for fd in channel or ():
                os.close(fd)
            self.send({"id": request.get("id"), "error": "fork: %s" % exc})
            return
        if pid == 0:
            child()
            os._exit(1)  # not reached
        os.close(w)
        if channel is not None:
            # the read end goes to the grader at once; none stays here for a later fork to find
            os.close(channel[1])
            try:
                socket.send_fds(self.grader, [json.dumps({"id": request.get("id")}).encode()], [channel[0]])
            except OSError:
                os._exit(71)  # the grader is gone: end, the service starts another server
            finally:
                os.close(channel[0])
            self.channels[r] = request.get("id")
        os.set_blocking(r, False)
        self.starting[r] = [request.get("id"), b"", None]
        if self.root:
            self.starting[r][2] = pid
            self.kernels.add(pid)

    def status(self, fd):
        entry = self.starting[fd]
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if chunk:
            entry[1] += chunk
            for line in entry[1].split(b"\n")[:-1]:
                if line.startswith(b"P") and line[1:].isdigit() and entry[2] is None:
                    entry[2] = int(line[1:])
                    self.kernels.add(entry[2])
            done = [line for line in entry[1].split(b"\n")[:-1] if line[:1] in (b"R", b"E")]
            if not done:
                return
            if entry[2] is None and not any(line[:1] == b"E" for line in done):
                # ready before its pid came: the fork that entered writes it after its own fork,
                # and may run after the program it forked (a short one reports at once); wait for it
                return
        del self.starting[fd]
        os.close(fd)
        channel = self.channels.pop(fd, None)
        lines = entry[1].decode("utf-8", "replace").splitlines()
        error = next((line[1:] for line in lines if line.startswith("E")), None)
        mode = next((line[1:] for line in lines if line.startswith("R")), None)
        pid = entry[2]
        if error is None and mode is not None and pid in self.early:
            # it ran and ended before its report was read here (a short program)
            self.send({"id": entry[0], "pid": pid, "mode": mode})
            self.send({"exit": pid, "code": self.early.pop(pid)})
            return
        if error is None and (mode is None or pid is None or pid not in self.kernels):
            error = "the kernel ended before it listened (exit code %s)" % self.early.get(pid)
        self.early.pop(pid, None)
        if error is not None and channel is not None:
            self.drop(channel)
        if error is not None:
            if pid is not None:
                self.kill(pid)
                self.ended.add(pid)
            self.send({"id": entry[0], "error": error})
        else:
            self.send({"id": entry[0], "pid": pid, "mode": mode})

    def drop(self, channel):
        """The grader forgets a channel whose program never started: the service sends nothing for it."""
        try:
            self.grader.send(json.dumps({"drop": channel}).encode())
        except OSError:
            os._exit(71)

    def kill(self, pid):
        # only a kernel not yet reaped: its pid (and process group) is still its own
        if pid in self.kernels:
            for target in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
                try:
                    target()
                except OSError:
                    pass

    def reap(self):
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == _grader_pid:
                # its channels have no answer now (the service reads the end of its pipe): end, so
                # that the service starts another server with another grader
                os._exit(71)
            if pid in self.kernels:
                self.kernels.discard(pid)
                code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
                if pid in self.ended:
                    self.ended.discard(pid)  # its start failed: the service never saw it
                elif not any(entry[2] == pid for entry in self.starting.values()):
                    self.send({"exit": pid, "code": code})
                else:
                    self.early[pid] = code

    def run(self):
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *args: None)
        buffer = b""
        while True:
            ready, _, _ = select.select([0, wake_r, *self.starting], [], [])
            # the status first: a kernel's pid is written before it can be reaped here
            for fd in ready:
                if fd in self.starting:
                    self.status(fd)
            if wake_r in ready:
                try:
                    while os.read(wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass
                self.reap()
            if 0 in ready:
                chunk = os.read(0, 65536)
                if not chunk:
                    return  # the service is gone
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    try:
                        request = json.loads(line)
                    except ValueError:
                        continue
                    if "kill" in request:
                        self.kill(int(request["kill"]))
                    else:
                        self.start(request)


def _open_ns(init, ns, pidns):
    fd = os.open("/proc/%d/ns/%s" % (init, ns), os.O_RDONLY | os.O_CLOEXEC)
    # the init's pid may have been reused since the service looked: its pid namespace says
    if ns == "pid" and os.fstat(fd).st_ino != pidns:
        os.close(fd)
        raise OSError("the sandbox's init is gone")
    return fd


def _fork_in_pidns(init, pidns, child):
    """Forks straight into the sandbox's pid namespace (root only: CAP_SYS_ADMIN in the server's
    own user namespace) and runs `child()` there, which never returns: one fork where a non-root
    server needs two (the second after entering the sandbox's user namespace). The namespace for
    children is set for this thread, the fork made, and set back to the server's own (setns
    allows the active namespace, the way back, as it allows its descendants); where the way back
    was refused at start, a thread of its own sets it and forks, then ends."""
    if _own_pidns is None:
        return _fork_in_pidns_thread(init, pidns, child)
    fd = _open_ns(init, "pid", pidns)
    try:
        _check(libc.setns(fd, CLONE_NEWPID), "setns pid")
    finally:
        os.close(fd)
    try:
        pid = os.fork()
    except BaseException:
        _restore_pidns()
        raise
    if pid == 0:
        try:
            child()
        finally:
            os._exit(1)
    _restore_pidns()
    return pid


def _restore_pidns():
    if libc.setns(_own_pidns, CLONE_NEWPID) != 0:
        # its next fork would land in a sandbox: end, the service starts another
        os._exit(70)


def _fork_in_pidns_thread(init, pidns, child):
    """The same from a thread of its own, whose namespace for children is never set back: the
    fork goes on in that thread, its only one, as its main one."""
    import threading

    result = {}

    def fork():
        try:
            fd = _open_ns(init, "pid", pidns)
            try:
                _check(libc.setns(fd, CLONE_NEWPID), "setns pid")
            finally:
                os.close(fd)
            pid = os.fork()
        except OSError as exc:
            result["error"] = exc
            return
        if pid == 0:
            try:
                child()
            finally:
                os._exit(1)
        result["pid"] = pid

    thread = threading.Thread(target=fork)
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["pid"]


def _enter(request, status, kernel, ipython, in_pidns, channel=None):
    """In the fork: enter the sandbox and become the kernel, after one more fork (the pid
    namespace is entered by the next child) unless the fork is in the sandbox's pid namespace."""
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        if not in_pidns:
            # dies with the fork server while it starts
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        # the terminal's other side, while this process may still take the service's descriptor
        tty = _open_tty(request["tty"]) if request.get("tty") is not None else None
        low = 3
        for fd in sorted(fd for fd in (status, tty, channel) if fd is not None):
            os.closerange(low, fd)
            low = fd + 1
        os.closerange(low, 65536)
        init = int(request["init"])
        fds = {}
        for ns in NS_ORDER:
            if (ns in ("user", "mnt", "pid") or ns in request.get("ns", [])) and not (in_pidns and ns == "pid"):
                fds[ns] = _open_ns(init, ns, int(request["pidns"]))
        for path in request.get("cgroup_procs", []):
            with open(path, "w") as f:
                f.write("0")  # this process (its pid is the sandbox's in there)
        user = request.get("user")
        if user is not None:
            os.setgroups([])
            os.setresgid(user[1], user[1], user[1])
            os.setresuid(user[0], user[0], user[0])
            # as exec after setpriv would: /proc/<pid> of the kernel stays its own
            _prctl(PR_SET_DUMPABLE, 1)
        _prctl(PR_SET_NO_NEW_PRIVS, 1)
        for ns in NS_ORDER:
            if ns in fds:
                _check(libc.setns(fds[ns], 0), "setns %s" % ns)
                os.close(fds[ns])
        pid = 0 if in_pidns else os.fork()
    except BaseException as exc:  # noqa: B902
        _report(status, "Ecannot enter the sandbox: %s" % exc)
        os._exit(1)
    if pid != 0:
        _report(status, "P%d" % pid)
        os._exit(0)
    try:
        if tty is not None:
            _become_program(request, status, tty)
        _become_kernel(request, status, kernel, ipython, channel)
    except BaseException as exc:  # noqa: B902
        _report(status, "Ecannot start the kernel: %s" % exc)
        os._exit(1)


def _open_tty(spec):
    """The slave side of the service's terminal whose master is the service's descriptor
    spec["fd"]: a copy of the master taken from the service (the server's parent) with
    pidfd_getfd, unlocked, its peer opened from it (TIOCGPTPEER: no path on the way), sized,
    and the copy closed. The service opened the master close-on-exec: no other process has it."""
    import fcntl
    import struct
    import termios

    if _service_pidfd is None:
        raise OSError("no pidfd of the service")
    libc.syscall.restype = ctypes.c_long
    master = libc.syscall(ctypes.c_long(SYS_PIDFD_GETFD), ctypes.c_int(_service_pidfd), ctypes.c_int(int(spec["fd"])), ctypes.c_uint(0))
    if master < 0:
        raise OSError(ctypes.get_errno(), "pidfd_getfd: %s" % os.strerror(ctypes.get_errno()))
    try:
        if not os.isatty(master) or os.stat("/dev/ptmx").st_rdev != os.fstat(master).st_rdev:
            raise OSError("the terminal descriptor is not a pseudo-terminal master")
        fcntl.ioctl(master, TIOCSPTLCK, struct.pack("i", 0))
        slave = fcntl.ioctl(master, TIOCGPTPEER, os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", int(spec["rows"]), int(spec["cols"]), 0, 0))
        if spec.get("plain"):
            # stty -echo -icanon -onlcr, without a stty to run in the sandbox
            attrs = termios.tcgetattr(slave)
            attrs[1] &= ~termios.ONLCR
            attrs[3] &= ~(termios.ECHO | termios.ICANON)
            termios.tcsetattr(slave, termios.TCSANOW, attrs)
        return slave
    finally:
        os.close(master)


def _become_program(request, status, tty):
    """What an entering process does (sh's ulimits and cd, then exec), for a program on the
    terminal: its own session with the terminal as its controlling one."""
    import fcntl
    import termios

    os.setsid()
    fcntl.ioctl(tty, termios.TIOCSCTTY, 0)
    for fd in (0, 1, 2):
        os.dup2(tty, fd)
    os.close(tty)
    _drop_capabilities()
    import resource

    for name, value in request.get("rlimits", {}).items():
        resource.setrlimit(getattr(resource, RLIMITS[name]), (value, value))
    env = dict(request["env"])
    os.chdir(request["cwd"])
    env["PWD"] = request["cwd"]
    # what Python changed at its start, which exec would keep (ignored signals and the mask)
    for signum in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT):
        signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    _report(status, "Rexec")
    argv = request["exec"]
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as exc:
        os.write(2, ("%s: %s\n" % (argv[0], exc.strerror)).encode("utf-8", "replace"))
    os._exit(127)


def _become_kernel(request, status, kernel, ipython, channel=None):
    os.setsid()
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    _drop_capabilities()
    import resource

    for name, value in request.get("rlimits", {}).items():
        limit = getattr(resource, RLIMITS[name])
        resource.setrlimit(limit, (value, value))
    os.environ.clear()
    os.environ.update(request["env"])
    if request.get("run") is None and kernel is not None:
        # a kernel's preload its server could not import for it (rollserve_kernel._import_preload)
        kernel._import_preload(os.environ.pop("ROLLSERVE_PYTHON_PRELOAD", ""))
    import time

    time.tzset()  # a TZ of the sandbox's
    os.chdir(request["cwd"])
    os.environ["PWD"] = request["cwd"]
    tempfile.tempdir = None
    sys.argv = [INPUT_MOUNT + "/rollserve_kernel.py", request["socket"]]
    if sys.path and sys.path[0] == "":
        sys.path[0] = INPUT_MOUNT
    if request.get("run") is not None:
        _run_program(request, status, channel)
    # named after its socket, as a spawned kernel's command line is: the kernel's processes can be told apart
    name = os.path.basename(request["socket"]).rsplit(".", 1)[0][:15].encode()
    libc.prctl(PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)
    plain = request.get("plain") or ipython is None
    shell = kernel.PlainShell() if plain else ipython
    if not plain:
        _adopt_ipython(shell)

    def ready(mode):
        _report(status, "R%s" % mode)
        os.close(status)

    kernel.serve(request["socket"], shell, ready)


def _run_program(request, status, channel=None):
    """`python -I -c <run>` with stdin from a staged file and stdout and stderr to files of the
    output directory, as the exec agent runs a command; its exit code is the fork's. A channel's
    write end becomes its descriptor 3."""
    source = os.open(request["stdin"], os.O_RDONLY) if request.get("stdin") else os.open("/dev/null", os.O_RDONLY)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    targets = [source, os.open(request["stdout"], flags, 0o600), os.open(request["stderr"], flags, 0o600)]
    for fd, target in enumerate(targets):
        os.dup2(target, fd)
        os.close(target)
    _report(status, "Rrun")
    os.close(status)
    if channel is not None and channel != 3:
        os.dup2(channel, 3)
        os.close(channel)
    # -I: no script directory, user site or PYTHON* variables (the server was started with -s and
    # the sandbox's base environment only)
    sys.argv = ["-c"]
    if sys.path and sys.path[0] in ("", INPUT_MOUNT):
        del sys.path[0]
    code = 0
    try:
        exec(compile(request["run"], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code & 0xFF
        else:
            sys.stderr.write("%s\n" % exc.code)
            code = 1
    except BaseException:  # noqa: B902
        import traceback

        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)


def _report(fd, line):
    try:
        os.write(fd, (line + "\n").encode("utf-8", "replace"))
    except OSError:
        pass


def _reseed_numpy():
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        try:
            numpy_random.seed()
        except Exception:
            pass


def _huge_pages():
    """The server's anonymous memory (its heap, Python's arenas) folded into transparent huge pages
    where a 2 MiB page fits within a mapping (MADV_COLLAPSE, Linux 6.1; elsewhere nothing happens):
    each fork then copies, and each fork's exit unmaps, one page-table entry where it did 512. A
    fork still copies what it writes to 4 KiB at a time (the kernel splits a huge page shared with
    the server at the first write), so nothing else a kernel does changes. Only the pages the
    server has are folded: no hint is left on its mappings, so that no later fault, in the server
    or in a fork, takes a 2 MiB page (pnpm bench kernel: the fork floor and the ten-turn rollouts)."""
    madvise = libc.madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    huge = 1 << 21
    try:
        with open("/proc/self/maps") as maps:
            lines = maps.read().splitlines()
    except OSError:
        return
    for line in lines:
        fields = line.split()
        # private writable mappings with no file: the heap and anonymous ones (not the stack)
        if len(fields) < 5 or fields[1] != "rw-p" or fields[4] != "0" or (len(fields) > 5 and fields[5] != "[heap]"):
            continue
        low, high = (int(x, 16) for x in fields[0].split("-"))
        start = (low + huge - 1) & ~(huge - 1)
        end = high & ~(huge - 1)
        if end > start and madvise(start, end - start, MADV_COLLAPSE) != 0 and ctypes.get_errno() in (errno.EINVAL, errno.ENOSYS):
            return  # a kernel without it, or huge pages turned off: as before


def _import_modules(names):
    """Modules every fork finds imported (a preload's), each once here rather than in every fork.
    A module missing from this interpreter is left out: what wants it finds out as it would anyway."""
    import importlib

    for name in names or []:
        try:
            importlib.import_module(name)
        except ImportError:
            pass


def _preload(spec):
    """A bare server's preload (SandboxPythonRun.preload): standard modules imported, and the
    caller's module made from its source (and its `prepare` function run), before any fork, so
    that no program pays for them.
    `random` reseeds itself in every fork (os.register_at_fork), numpy's as main sets."""
    import types

    _import_modules(spec.get("modules"))
    module = spec.get("module")
    if module:
        made = types.ModuleType(module["name"])
        made.__file__ = module.get("file") or module["name"] + ".py"
        exec(compile(module["source"], made.__file__, "exec"), made.__dict__)
        sys.modules[module["name"]] = made
        if module.get("prepare"):
            # the caller's warm-up (its own code, as the rest of its module): what it makes and
            # specialises here, no fork makes or copies again
            try:
                made.__dict__[module["prepare"]]()
            except Exception:
                pass
    # what the imports and the warm-up left for the collector, collected once here rather than in
    # every fork that reaches the threshold (each collection writes to every object it visits)
    gc.collect()
    return made if module else None


# The bounds of one channel's grading, each an rlimit of the process that grades it (below): its
# address space (what it buffers or decodes of a flood ends in a MemoryError, that channel's
# failure, not in the host's memory) and its CPU (a host function fed something quadratic, or a
# flood's one json.loads in C, ends there: SIGPROF at the budget for an answer that says so, and
# RLIMIT_CPU's SIGXCPU and SIGKILL past it whatever the process is doing).
GRADER_MEMORY_BYTES = 4 << 30
CHANNEL_MEMORY_BYTES = 2 << 30
CHANNEL_CPU_SECONDS = 20.0
GRADER_NOBODY = 65534


class _Overrun(BaseException):
    """A channel's grading went past its CPU time (raised from SIGPROF, not an Exception: the
    host function's own handlers do not take it)."""


def _overrun(signum, frame):
    raise _Overrun


def _grade_channel(cid, fd, line, out, host, grader):
    """One channel's grading, in a process of its own forked by the grader: `host(data)` (data from
    the service's request `line`) fed the channel's bytes as they come, its answer one line on `out`
    (to the grader, which relays it whole). Nothing it does delays another channel's."""
    import resource

    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != grader:
        os._exit(0)  # the grader ended before the line above (its orphans go to the server, a subreaper)
    hard = int(CHANNEL_CPU_SECONDS) + 2
    resource.setrlimit(resource.RLIMIT_CPU, (hard - 1, hard))
    resource.setrlimit(resource.RLIMIT_AS, (CHANNEL_MEMORY_BYTES, CHANNEL_MEMORY_BYTES))
    signal.signal(signal.SIGPROF, _overrun)
    try:
        try:
            signal.setitimer(signal.ITIMER_PROF, CHANNEL_CPU_SECONDS)
            data = json.loads(line).get("data")
            line[:] = b""
            steps = host(data)
            next(steps)
            os.set_blocking(fd, True)
            while True:
                try:
                    chunk = os.read(fd, 1 << 16)
                except OSError:
                    chunk = b""
                steps.send(chunk)
                if not chunk:
                    raise EOFError("the channel ended")
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)
    except StopIteration as done:
        message = {"result": done.value}
    except _Overrun:
        message = {"error": "its grading took more than %g s of CPU" % CHANNEL_CPU_SECONDS}
    except BaseException as exc:  # noqa: B902
        message = {"error": "%s: %s" % (type(exc).__name__, str(exc)[:200])}
    try:
        text = json.dumps({"id": cid, **message}, default=str)  # the id first: the grader checks it
    except BaseException as exc:  # noqa: B902
        text = json.dumps({"id": cid, "error": "its answer: %s: %s" % (type(exc).__name__, str(exc)[:200])})
    data = (text + "\n").encode()
    while data:
        data = data[os.write(out, data):]


def _grader(sock, requests, answers, host):
    """The grader's loop: channels' read ends from the server (`sock`), their data from the
    service (`requests`), one answer each on `answers`. Once a channel has both its descriptor and
    its data, a process forked for it grades it (`_grade_channel`) and the loop goes on: however
    long one channel's grading takes or whatever it is sent, every other channel is served. Each
    answer comes back whole on a pipe of that process's own and is written here, so answers from
    several channels never interleave (writes over PIPE_BUF from several writers could)."""
    import re

    request_id = re.compile(rb'\{\s*"id"\s*:\s*(\d+)\s*[,}]')
    pending = {}  # id -> {"fd", "line"}: until both are here
    running = {}  # the read end of a grading process's answer pipe -> {"id", "pid", "got", "dropped"}
    inbox = bytearray()

    def drop(cid):
        entry = pending.pop(cid, None)
        if entry is not None:
            if "fd" in entry:
                os.close(entry["fd"])
            if "line" in entry:
                entry["line"][:] = b""
        for child in running.values():
            if child["id"] == cid and not child["dropped"]:
                child["dropped"] = True
                os.kill(child["pid"], signal.SIGKILL)

    def answer(cid, message):
        write((json.dumps(dict(message, id=cid)) + "\n").encode())

    def write(data):
        while data:
            data = data[os.write(answers, data):]

    def start(cid, entry):
        r, w = os.pipe()
        grader = os.getpid()
        pid = os.fork()
        if pid == 0:
            try:
                # what this process holds of any other channel: nothing (descriptors closed, lines zeroed)
                sock.close()
                for fd in (requests, answers, r, *running):
                    os.close(fd)
                for other in pending.values():
                    if "fd" in other:
                        os.close(other["fd"])
                    if "line" in other:
                        other["line"][:] = b""
                inbox[:] = b""
                _grade_channel(cid, entry["fd"], entry["line"], w, host, grader)
            finally:
                os._exit(0)
        os.close(w)
        os.close(entry["fd"])
        entry["line"][:] = b""
        running[r] = {"id": cid, "pid": pid, "got": bytearray(), "dropped": False}

    def got(cid, key, value):
        entry = pending.setdefault(cid, {})
        entry[key] = value
        if "fd" in entry and "line" in entry:
            del pending[cid]
            start(cid, entry)

    def ended(r):
        child = running.pop(r)
        os.close(r)
        _, status = os.waitpid(child["pid"], 0)
        if child["dropped"]:
            return
        line = bytes(child["got"])
        prefix = request_id.match(line)
        if line.endswith(b"\n") and line.count(b"\n") == 1 and prefix is not None and int(prefix.group(1)) == child["id"]:
            write(line)
        elif os.WIFSIGNALED(status) and os.WTERMSIG(status) in (signal.SIGXCPU, signal.SIGKILL):
            answer(child["id"], {"error": "its grading took more than %g s of CPU" % CHANNEL_CPU_SECONDS})
        else:
            answer(child["id"], {"error": "its grading ended without an answer (status %d)" % status})

    while True:
        readable, _, _ = select.select([sock, requests, *running], [], [])
        if sock in readable:
            try:
                message, fds, _, _ = socket.recv_fds(sock, 4096, 1)
            except OSError:
                message, fds = b"", []
            if not message:
                os._exit(0)  # the server is gone (the grading processes die with this one)
            note = json.loads(message)
            if "drop" in note:
                drop(note["drop"])
            elif fds:
                got(note["id"], "fd", fds[0])
            for fd in fds[1:]:
                os.close(fd)
        if requests in readable:
            chunk = os.read(requests, 1 << 20)
            if not chunk:
                os._exit(0)  # the service is gone
            # (a line of data may be megabytes: only the new chunk is searched for its end, and
            # only its id is read here; the data is decoded by the channel's own process)
            start_at = len(inbox)
            inbox += chunk
            while True:
                end = inbox.find(b"\n", start_at)
                if end < 0:
                    break
                line = bytearray(inbox[:end])
                del inbox[:end + 1]
                start_at = 0
                prefix = request_id.match(line)
                if prefix is not None:
                    got(int(prefix.group(1)), "line", line)
                    continue
                try:
                    request = json.loads(line)
                except ValueError:
                    continue
                if isinstance(request, dict) and "drop" in request:
                    drop(request["drop"])
        for r in [fd for fd in readable if fd in running]:
            chunk = os.read(r, 1 << 16)
            if chunk:
                running[r]["got"] += chunk
            else:
                ended(r)


def _start_grader(host):
    """Forks the grader (before any request: it holds nothing of a sandbox's) and gives it fds 4
    and 5, the service's pipes to it; returns the server's end of the socket pair. A root server's
    grader drops to nobody with no capabilities: it reads what programs send and needs no right."""
    global _grader_pid, socket
    # (imported here, by a server with a grader only: the forks of any other find no more than before)
    import socket

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        try:
            ours.close()
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() == 1:
                os._exit(0)
            keep = sorted((2, 4, 5, theirs.fileno()))
            null = os.open("/dev/null", os.O_RDWR)
            os.dup2(null, 0)
            os.dup2(null, 1)
            os.close(null)
            low = 3
            for fd in keep:
                if fd >= low:
                    os.closerange(low, fd)
                    low = fd + 1
            os.closerange(low, 65536)
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (GRADER_MEMORY_BYTES, GRADER_MEMORY_BYTES))
            if os.geteuid() == 0:
                os.setgroups([])
                os.setresgid(GRADER_NOBODY, GRADER_NOBODY, GRADER_NOBODY)
                os.setresuid(GRADER_NOBODY, GRADER_NOBODY, GRADER_NOBODY)
            _prctl(PR_SET_NO_NEW_PRIVS, 1)
            _prctl(PR_SET_DUMPABLE, 0)
            os.set_blocking(4, True)
            _grader(theirs, 4, 5, host)
        finally:
            os._exit(1)
    theirs.close()
    os.close(4)
    os.close(5)
    _grader_pid = pid
    return ours


# the service, the server's parent, whose terminal descriptors a fork takes (_open_tty): a pidfd
# (a pid would name another process in a sandbox's pid namespace, where a root server forks)
_service_pidfd = None
# the server's own pid namespace (root), which _fork_in_pidns sets back after each fork
_own_pidns = None
# the grader's pid, if this server has one, and the socket module it was started with
_grader_pid = None
socket = None


def _probe_own_pidns():
    """The server's pid namespace, where setting it back as the namespace for children is allowed
    (the same check as after a fork into a sandbox's); None otherwise."""
    try:
        fd = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    if libc.setns(fd, CLONE_NEWPID) != 0:
        os.close(fd)
        return None
    return fd


def main(kernel_source, plain=False, preload=""):
    global _service_pidfd, _own_pidns
    # what every fork imports: once here, not in each (a C extension is a dlopen)
    import fcntl  # noqa: F401
    import resource  # noqa: F401
    import struct  # noqa: F401
    import termios  # noqa: F401
    import threading  # noqa: F401
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.geteuid() == 0:
        libc.syscall.restype = ctypes.c_long
        pidfd = libc.syscall(ctypes.c_long(SYS_PIDFD_OPEN), ctypes.c_int(os.getppid()), ctypes.c_uint(0))
        _service_pidfd = pidfd if pidfd >= 0 else None
        _own_pidns = _probe_own_pidns()
    # a kernel whose fork (the one that entered the sandbox) exits is reparented here and reaped
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    os.chdir("/")
    # a bare server forks programs and shells, never a kernel: its forks find neither the kernel
    # nor what it imports (sockets, queues, compressors), as a new interpreter would not, and
    # each fork copies the page tables of a smaller process
    kernel = None if plain else _load_kernel(kernel_source)
    if not plain and preload:
        # the modules a kernel's caller asked for (PythonKernelOptions.preload), before the shell
        # is made and warmed: what they make is frozen with it below, shared by every kernel
        _import_modules(json.loads(preload).get("modules"))
    grader = None
    if plain and preload:
        spec = json.loads(preload)
        made = _preload(spec)
        host = (spec.get("module") or {}).get("host")
        if host and made is not None and callable(made.__dict__.get(host)):
            grader = _start_grader(made.__dict__[host])
    ipython = None if plain else _prepare_ipython(kernel)
    if ipython is not None:
        # what is made by now is every kernel's, read-only in effect: the collector of a kernel
        # skips it, so its pages stay shared with the server rather than copied on the first
        # collection. (A plain server, for programs, keeps a fresh interpreter's collector.)
        gc.collect()
        gc.freeze()
    if "numpy.random" in sys.modules:
        # numpy's global generator (np.random.rand and the like) is seeded from the OS when it is
        # imported, here, once: every fork would draw the same numbers, where a new interpreter
        # draws its own. Each fork reseeds it, as `random` reseeds itself (os.register_at_fork).
        os.register_at_fork(after_in_child=_reseed_numpy)
    _huge_pages()
    os.write(1, ("READY %s\n" % ("ipython" if ipython is not None else "plain")).encode())
    server = Server(kernel, ipython)
    server.grader = grader
    server.run()
