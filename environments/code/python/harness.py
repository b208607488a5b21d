# Runs one submission's unit tests inside the sandbox, with the semantics of NeMo Gym's code_gen
# (lcb_integration/testing_util.py `run_test`): the same program wrapping, stdin/stdout mocks,
# SIGALRM per test, comparison rules, status codes and metadata. Written for rollserve; no code
# is taken from NeMo Gym.
#
# Protocol: the host writes, on stdin, a 16-digit length and the setup (harness source, code,
# inputs, fn_name, timeout, limits) as JSON.
#
# Forked by the bwrap provider (the setup says "channel"), this process is the child itself: it
# runs the submission with /dev/null for descriptors 0-2 and reports each test's raw output on
# descriptor 3, a pipe whose read end is with the fork server's grader on the host. There `host`
# below grades the channel with the expected outputs, which the service gives the grader only once
# this process runs: they are never in this process, in the sandbox, or in the fork server it was
# forked from; the grader answers the service on a pipe of its own, so nothing here can forge it.
# Each channel is graded in a process of its own, forked by the grader for it (as the grader: nobody
# without capabilities under a root service, non-dumpable; 20 s of CPU and 2 GiB of address space
# as its own rlimits): what this process sends, however large or slow to compare, delays no other
# run's verdict.
#
# Executed (no fork server: other providers, images), the setup is followed on stdin by the secret
# part {outputs, key}, and this process is the grading parent: it forks the child that runs the
# submission BEFORE reading the secret part, so the child's memory never held it; the child gets
# /dev/null for descriptors 0-2 and only the write end of a pipe on which it reports as above. The
# parent compares with the same code as `host` and writes one line "<hmac-sha256(key, json)>
# <json>" to its stdout; the key never leaves the parent, which is non-dumpable (no
# /proc/<pid>/{mem,fd} for the child), and the payload file is unlinked first.
#
# A run whose child dies or sends anything else has no verdict: the host then reports a global
# failure, as code_gen does when its child leaves no result.

import ast
import builtins
import faulthandler
import io
import json
import os
import resource
import signal
import sys
import time
import traceback
from decimal import Decimal

_FROM_IMPORTS = ['string', 're', 'datetime', 'collections', 'heapq', 'bisect', 'copy', 'math', 'random',
                 'statistics', 'itertools', 'functools', 'operator', 'io', 'sys', 'json', 'builtins', 'typing']
_PLAIN_IMPORTS = _FROM_IMPORTS[:16]
# The preamble code_gen puts in front of every program (same text, so the same name shadowing).
PREAMBLE = (''.join(f'from {m} import *\n' for m in _FROM_IMPORTS)
            + ''.join(f'import {m}\n' for m in _PLAIN_IMPORTS)
            + 'sys.setrecursionlimit(50000)\n')

TOLERANCE = Decimal('1e-6')


class TimeoutException(Exception):
    pass


def _on_alarm(signum, frame):
    raise TimeoutException


def shorten(value, length=300):
    text = value if isinstance(value, str) else str(value)
    if len(text) <= length:
        return text
    return text[: length // 2] + '...(truncated) ...' + text[-length // 2:]


# ---------------------------------------------------------------------------------------------
# Program preparation


def drop_main_guard(code):
    """A trailing `if __name__ == '__main__':` block is replaced by its body."""
    try:
        tree = ast.parse(code)
        last = tree.body[-1]
        if isinstance(last, ast.If) and ast.unparse(last.test).strip() == "__name__ == '__main__'":
            code = ast.unparse(tree.body[:-1]) + '\n' + ast.unparse(last.body)
    except Exception:
        pass
    return code


def as_function(code):
    """Imports stay at module level; every other statement becomes the body of wrapped_function."""
    try:
        tree = ast.parse(code)
        imports = [s for s in tree.body if isinstance(s, (ast.Import, ast.ImportFrom))]
        rest = [s for s in tree.body if not isinstance(s, (ast.Import, ast.ImportFrom))]
        no_args = ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[])
        func = ast.FunctionDef(name='wrapped_function', args=no_args, body=rest, decorator_list=[], lineno=-1)
        return PREAMBLE + '\n' + ast.unparse(imports) + '\n' + ast.unparse(func)
    except Exception:
        return code


def load(code, timeout):
    signal.alarm(timeout)
    try:
        module = type(sys)('tmp_sol', '')
        exec(code, module.__dict__)
        target = module.Solution() if 'class Solution' in code else module
        assert target is not None
    finally:
        signal.alarm(0)
    return target


def lookup(target, name):
    try:
        assert hasattr(target, name)
        return getattr(target, name)
    except Exception:
        return None


# ---------------------------------------------------------------------------------------------
# Standard input mocks (what the program sees while a stdin/stdout test runs)


class FakeBinaryStdin:
    def __init__(self, text):
        self._bytes = io.BytesIO(text.encode('utf-8'))

    def read(self, *args):
        return self._bytes.read(*args)

    def readline(self, *args):
        return self._bytes.readline(*args)

    def readlines(self, *args):
        return self._bytes.readlines(*args)

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._bytes)

    def __getattr__(self, name):
        return getattr(self._bytes, name)


class FakeStdin:
    def __init__(self, text):
        self.inputs = text
        self._text = io.StringIO(text)
        self.buffer = FakeBinaryStdin(text)

    def read(self, *args):
        return self.inputs

    def readline(self, *args):
        return self._text.readline(*args)

    def readlines(self, *args):
        return self.inputs.split('\n')

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._text)

    def __getattr__(self, name):
        return getattr(self._text, name)


class FakeFile:
    """What `builtins.open(...)` returns during a test: a fresh reader over the test input."""

    def __init__(self, text):
        self._text = io.StringIO(text)

    def read(self, *args, **kwargs):
        return self._text.read(*args, **kwargs)

    def readline(self, *args, **kwargs):
        return self._text.readline(*args, **kwargs)

    def readlines(self, *args, **kwargs):
        return self._text.readlines(*args, **kwargs)

    def __iter__(self):
        return iter(self._text.readline, '')

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def run_with_input(method, inputs):
    if isinstance(inputs, list):
        inputs = '\n'.join(inputs)
    lines = iter(inputs.split('\n'))
    real_stdin = sys.stdin
    saved_open = builtins.open
    # code_gen's patches of sys.stdin.read/readline/readlines land on the stdin object that is
    # current before sys.stdin itself is replaced.
    patched = {
        'read': lambda *args: inputs,
        'readlines': lambda *args: inputs.split('\n'),
        'readline': lambda *args: next(lines),
    }
    applied = []
    for name, value in patched.items():
        try:
            setattr(real_stdin, name, value)
            applied.append(name)
        except Exception:
            pass
    sys.stdin = FakeStdin(inputs)
    builtins.open = lambda *args, **kwargs: FakeFile(inputs)
    try:
        try:
            return method()
        except SystemExit:
            pass
    finally:
        builtins.open = saved_open
        sys.stdin = real_stdin
        for name in applied:
            try:
                delattr(real_stdin, name)
            except Exception:
                pass


class CapturedStdout(list):
    def __enter__(self):
        self._saved = sys.stdout
        self._buffer = io.StringIO()
        self._buffer.close = lambda x: 1
        sys.stdout = self._buffer
        return self

    def __exit__(self, *exc):
        self.append(self._buffer.getvalue())
        del self._buffer
        sys.stdout = self._saved


# ---------------------------------------------------------------------------------------------
# Comparison


def stripped_lines(text):
    return [line.strip() for line in text.strip().split('\n')]


def to_decimals(line):
    try:
        return True, [Decimal(token) for token in line.split()]
    except Exception:
        return False, []


def looks_fractional(token):
    return '.' in token or 'e' in token.lower()


def decimals_match(expected_token, predicted_token, expected, predicted):
    if expected == predicted:
        return True
    if not (looks_fractional(expected_token) or looks_fractional(predicted_token)):
        return False
    if not (expected.is_finite() and predicted.is_finite()):
        return False
    error = abs(expected - predicted)
    return error <= TOLERANCE or error / max(abs(expected), Decimal(1)) <= TOLERANCE


def decimal_lines_match(expected_tokens, predicted_tokens, expected, predicted):
    if len(expected) != len(predicted):
        return False
    return all(decimals_match(*four) for four in zip(expected_tokens, predicted_tokens, expected, predicted))


def close_floats(a, b):
    """numpy.allclose on two scalars (rtol 1e-5, atol 1e-8, NaN never close)."""
    if a == b:
        return True
    if a != a or b != b or a in (float('inf'), float('-inf')) or b in (float('inf'), float('-inf')):
        return False
    return abs(a - b) <= 1e-8 + 1e-5 * abs(b)


def failure(kind, error_repr, test_input, expected, traceback_text):
    meta = {
        'error': error_repr,
        'error_code': kind,
        'error_message': 'Time Limit Exceeded' if kind == -3 else 'Runtime Error',
        'inputs': shorten(test_input),
        'expected': shorten(expected),
    }
    if kind != -3:
        meta['traceback'] = traceback_text
    return meta


def classify(error):
    """The child's report of an exception raised by a test: code_gen's -3 or -4, repr and traceback."""
    if 'timeoutexception' in repr(error).lower():
        return {'t': 'error', 'code': -3, 'error': repr(error), 'traceback': None}
    return {'t': 'error', 'code': -4, 'error': repr(error), 'traceback': traceback.format_exc()}


# ---------------------------------------------------------------------------------------------
# The split. The process that runs the submission (the child) holds only the code and the test
# inputs: it runs every test in order and sends back what each one produced (captured stdout, or
# the returned value) through a pipe. The parent, which never runs submission code, holds the
# expected outputs and the key of the result channel, compares, and writes the verdict. Whatever
# the child sends is data to compare; a child that lies only gets its own outputs wrong.


def frame(message):
    data = json.dumps(message).encode('ascii')
    return b'%d\n' % len(data) + data


def send(fd, message):
    data = frame(message)
    while data:
        data = data[os.write(fd, data):]


class Opaque(Exception):
    pass


def encode(value, depth=0):
    """The returned value as tagged JSON, exact for the builtin types (tuple vs list, int keys, nan)."""
    if depth > 2000:
        raise Opaque
    if value is None or value is True or value is False:
        return value
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return ['i', format(int.__index__(value), 'x')]
    if isinstance(value, float):
        return ['f', float.__repr__(value)]
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, complex):
        return ['c', float.__repr__(value.real), float.__repr__(value.imag)]
    for kind, tag in ((list, 'l'), (tuple, 't'), (set, 's'), (frozenset, 'z')):
        if isinstance(value, kind):
            return [tag, [encode(item, depth + 1) for item in kind.__iter__(value)]]
    if isinstance(value, dict):
        return ['d', [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in dict.items(value)]]
    raise Opaque


def decode(data, depth=0):
    if depth > 2000:
        raise ValueError('too deep')
    if data is None or isinstance(data, (bool, str)):
        return data
    if not isinstance(data, list) or not data or not isinstance(data[0], str):
        raise ValueError('bad value')
    tag = data[0]
    if tag == 'i' and len(data) == 2 and isinstance(data[1], str):
        return int(data[1], 16)
    if tag == 'f' and len(data) == 2 and isinstance(data[1], str):
        return float(data[1])
    if tag == 'c' and len(data) == 3 and isinstance(data[1], str) and isinstance(data[2], str):
        return complex(float(data[1]), float(data[2]))
    if len(data) != 2 or not isinstance(data[1], list):
        raise ValueError('bad value')
    items = data[1]
    if tag == 'l':
        return [decode(item, depth + 1) for item in items]
    if tag == 't':
        return tuple(decode(item, depth + 1) for item in items)
    if tag == 's':
        return set(decode(item, depth + 1) for item in items)
    if tag == 'z':
        return frozenset(decode(item, depth + 1) for item in items)
    if tag == 'd':
        pairs = {}
        for pair in items:
            if not isinstance(pair, list) or len(pair) != 2:
                raise ValueError('bad value')
            pairs[decode(pair[0], depth + 1)] = decode(pair[1], depth + 1)
        return pairs
    raise ValueError('bad value')


def describe(prediction):
    """What the parent needs of a returned value for code_gen's three comparisons and its metadata."""
    if isinstance(prediction, tuple):
        prediction = list(prediction)
    message = {'t': 'value', 'value': None, 'opaque': False, 'json': None, 'float': None, 'text': ''}
    try:
        message['value'] = encode(prediction)
    except (Opaque, RecursionError, ValueError, TypeError):
        message['opaque'] = True
    try:
        message['json'] = json.dumps(prediction)
    except Exception:
        pass
    try:
        message['float'] = float.__repr__(float(prediction))
    except Exception:
        pass
    try:
        message['text'] = shorten(prediction)
    except Exception:
        pass
    return message


def child_call_based(out, code, all_inputs, fn_name, timeout):
    target = load(PREAMBLE + '\n\n' + code, timeout)
    if target is None:
        return None
    method = lookup(target, fn_name)
    if method is None:
        return None
    all_inputs = [[json.loads(line) for line in text.split('\n')] for text in all_inputs]
    send(out, {'t': 'ready'})
    for args in all_inputs:
        signal.alarm(timeout)
        faulthandler.enable()
        try:
            start = time.time()
            prediction = method(*args)
            elapsed = time.time() - start
            signal.alarm(0)
            message = describe(prediction)
            message['time'] = elapsed
        except Exception as error:
            signal.alarm(0)
            message = classify(error)
            message['inputs'] = args_text(args)
            send(out, message)
            return True
        finally:
            signal.alarm(0)
            faulthandler.disable()
        # code_gen's metadata shows the arguments as the call left them (a method may sort in place).
        message['inputs'] = args_text(args)
        send(out, message)
    return True


def args_text(args):
    try:
        return shorten(args)
    except Exception:
        return None


def child_stdio(out, code, all_inputs, timeout):
    target = load(as_function(drop_main_guard(code)), timeout)
    if target is None:
        return None
    method = lookup(target, 'wrapped_function')
    if method is None:
        return None
    send(out, {'t': 'ready'})
    for test_input in all_inputs:
        signal.alarm(timeout)
        faulthandler.enable()
        signal.alarm(timeout)
        error_message = None
        with CapturedStdout() as captured:
            try:
                start = time.time()
                run_with_input(method, test_input)
                elapsed = time.time() - start
                signal.alarm(0)
            except Exception as error:
                signal.alarm(0)
                error_message = classify(error)
            finally:
                signal.alarm(0)
                faulthandler.disable()
        if error_message is not None:
            send(out, error_message)
            return True
        send(out, {'t': 'output', 'output': captured[0], 'time': elapsed})
    return True


def child(out, setup):
    """Runs in the child only: code_gen's run_test, minus the comparisons."""
    signal.signal(signal.SIGALRM, _on_alarm)
    guard()
    timeout = setup['timeout']
    signal.alarm(timeout)
    try:
        if setup.get('fn_name') is not None:
            done = child_call_based(out, setup['code'], setup['inputs'], setup['fn_name'], timeout)
        else:
            done = child_stdio(out, setup['code'], setup['inputs'], timeout)
        if done is None:
            send(out, {'t': 'setup_error', 'message': 'cannot unpack non-iterable NoneType object'})
    except Exception as error:
        send(out, {'t': 'setup_error', 'message': str(error)})
    finally:
        signal.alarm(0)


class ProtocolError(Exception):
    pass


class Reader:
    """Length-prefixed JSON messages from the child's channel; anything else ends the run unreported.
    A generator reader: `message = yield from reader.next(kinds)` yields whenever it needs more of
    the channel and is sent the next chunk (b'' at its end), so the same grading runs under a
    blocking loop (the parent in the sandbox, `drive`) or in a host-side grader serving many
    channels at once (`host`). A message longer than `limit` bytes is a flood: no result."""

    def __init__(self, limit=None):
        self.buffer = bytearray()
        self.limit = limit

    def _fill(self):
        chunk = yield
        if not chunk:
            raise EOFError
        self.buffer += chunk

    def next(self, kinds):
        while b'\n' not in self.buffer[:24]:
            if len(self.buffer) > 24:
                raise ProtocolError('bad frame')
            yield from self._fill()
        head, _, _ = bytes(self.buffer[:24]).partition(b'\n')
        if not head.isdigit():
            raise ProtocolError('bad frame')
        size = int(head)
        if self.limit is not None and size > self.limit:
            raise ProtocolError('message too long')
        need = len(head) + 1 + size
        while len(self.buffer) < need:
            yield from self._fill()
        data = bytes(self.buffer[len(head) + 1:need])
        del self.buffer[:need]
        message = json.loads(data)
        if not isinstance(message, dict) or message.get('t') not in kinds:
            raise ProtocolError('unexpected message')
        return message


def drive(steps, fd):
    """Runs a generator of `Reader` steps on a blocking descriptor; returns what it returns."""
    try:
        next(steps)
        while True:
            steps.send(os.read(fd, 1 << 20))
    except StopIteration as done:
        return done.value


def number(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise ProtocolError('bad time')
    return value


def text(value):
    if not isinstance(value, str):
        raise ProtocolError('bad text')
    return value


def reported_inputs(message, parsed):
    """Call-based metadata shows the arguments after the call, as the child saw them."""
    value = message.get('inputs')
    return shorten(parsed) if value is None else text(value)


def error_metadata(message, test_input, expected):
    kind = message.get('code')
    if kind not in (-3, -4):
        raise ProtocolError('bad code')
    trace = message.get('traceback')
    return kind, failure(kind, text(message.get('error')), test_input, expected, None if kind == -3 else text(trace))


def grade_call_based(reader, all_inputs, all_outputs):
    all_inputs = [[json.loads(line) for line in text_.split('\n')] for text_ in all_inputs]
    all_outputs = [json.loads(text_) for text_ in all_outputs]
    elapsed = 0
    results = []
    for args, expected in zip(all_inputs, all_outputs):
        message = yield from reader.next(('value', 'error'))
        if message['t'] == 'error':
            code_, meta = error_metadata(message, args, expected)
            meta['inputs'] = reported_inputs(message, args)
            results.append(code_)
            return results, meta
        elapsed += number(message.get('time'))
        ok = False
        if message.get('opaque') is False:
            try:
                value = decode(message.get('value'))
            except (ValueError, TypeError, RecursionError) as error:
                raise ProtocolError('bad value') from error
            ok = value == expected
        elif message.get('opaque') is not True:
            raise ProtocolError('bad value')
        dumped = message.get('json')
        if dumped is not None:
            ok = ok or (text(dumped) == json.dumps(expected))
        as_float = message.get('float')
        if as_float is not None:
            try:
                ok = ok or close_floats(float(text(as_float)), float(expected))
            except ProtocolError:
                raise
            except Exception:
                pass
        results.append(ok)
        if not ok:
            return results, {
                'output': shorten(text(message.get('text'))),
                'inputs': reported_inputs(message, args),
                'expected': shorten(expected),
                'error_code': -2,
                'error_message': 'Wrong Answer',
            }
    return results, {'execution time': elapsed}


def grade_stdio(reader, all_inputs, all_outputs):
    results = []
    elapsed = 0
    for test_input, expected in zip(all_inputs, all_outputs):
        message = yield from reader.next(('output', 'error'))
        if message['t'] == 'error':
            code_, meta = error_metadata(message, test_input, expected)
            results.append(code_)
            return results, meta
        elapsed += number(message.get('time'))
        prediction = text(message.get('output'))
        predicted_lines = stripped_lines(prediction)
        expected_lines = stripped_lines(expected)
        wrong = {'output': shorten(prediction), 'inputs': shorten(test_input), 'expected': shorten(expected), 'error_code': -2}
        if len(predicted_lines) != len(expected_lines):
            results.append(-2)
            wrong['error_message'] = 'Wrong answer: mismatched output length'
            return results, wrong
        for output_line_idx, (predicted_line, expected_line) in enumerate(zip(predicted_lines, expected_lines)):
            wrong['error_message'] = (
                f'Wrong answer at {output_line_idx=}: {shorten(predicted_line)} != {shorten(expected_line)}'
            )
            if predicted_line == expected_line:
                continue
            ok, predicted_numbers = to_decimals(predicted_line)
            if not ok:
                results.append(-2)
                return results, wrong
            ok, expected_numbers = to_decimals(expected_line)
            if not ok:
                results.append(-2)
                return results, wrong
            if decimal_lines_match(expected_line.split(), predicted_line.split(), expected_numbers, predicted_numbers):
                continue
            results.append(-2)
            return results, wrong
        results.append(True)
    return results, {'execution time': elapsed}


def grade(reader, setup, outputs):
    """The parent's run_test: the child's setup outcome, then one comparison per test."""
    message = yield from reader.next(('ready', 'setup_error'))
    try:
        if message['t'] == 'setup_error':
            raise RuntimeError(text(message.get('message')))
        if setup.get('fn_name') is not None:
            return (yield from grade_call_based(reader, setup['inputs'], outputs))
        return (yield from grade_stdio(reader, setup['inputs'], outputs))
    except (ProtocolError, EOFError, MemoryError):
        # no result: a child that sent no outputs, or a grader out of memory, is no test's failure
        raise
    except Exception as error:
        return [-4], {'error_code': -4, 'error_message': f'Error during testing: {error}'}


# ---------------------------------------------------------------------------------------------
# Process setup


def raise_soft_limit(kind, target):
    soft, hard = resource.getrlimit(kind)
    if soft < target:
        try:
            resource.setrlimit(kind, (target, hard))
        except ValueError as error:
            print(repr(error))


def cap_limit(kind, value):
    soft, hard = resource.getrlimit(kind)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    try:
        resource.setrlimit(kind, (value, value))
    except (ValueError, OSError):
        pass


def guard():
    """code_gen's reliability_guard: the same limits and the same disabled functions."""
    raise_soft_limit(resource.RLIMIT_DATA, 4 * 1024 ** 3)
    if os.uname().sysname != 'Darwin':
        raise_soft_limit(resource.RLIMIT_STACK, 4 * 1024 ** 3)
    faulthandler.disable()
    builtins.quit = None
    os.environ['OMP_NUM_THREADS'] = '1'
    for name in ['kill', 'system', 'putenv', 'remove', 'removedirs', 'rmdir', 'fchdir', 'setuid', 'fork',
                 'forkpty', 'killpg', 'rename', 'renames', 'truncate', 'replace', 'unlink', 'fchmod', 'fchown',
                 'chmod', 'chown', 'chroot', 'lchflags', 'lchmod', 'lchown', 'getcwd', 'chdir']:
        setattr(os, name, None)
    import shutil
    import subprocess
    shutil.rmtree = None
    shutil.move = None
    shutil.chown = None
    subprocess.Popen = None
    builtins.help = None
    for name in ['ipdb', 'joblib', 'resource', 'psutil', 'tkinter']:
        sys.modules[name] = None


def plain(value):
    if isinstance(value, bool) or isinstance(value, int):
        return value
    try:
        return bool(value)
    except Exception:
        return False


_libc = []


def set_dumpable(flag):
    """Non-dumpable: no other process of the sandbox's uid may open /proc/<pid>/{mem,fd,environ}."""
    try:
        if not _libc:
            # opened once (a forked harness finds it made: a dlopen less per run, in each process)
            import ctypes
            _libc.append(ctypes.CDLL(None, use_errno=True))
        return _libc[0].prctl(4, 1 if flag else 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE
    except Exception:
        return False


def forget_stdin_file():
    """The payload file the sandbox's exec agent feeds as stdin leaves the file system."""
    try:
        path = os.readlink('/proc/self/fd/0')
        st, own = os.stat(path), os.fstat(0)
        if '/.exec/' in path and path.endswith('.in') and (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino):
            os.unlink(path)
    except OSError:
        pass


_PAD_IN = bytes(b ^ 0x36 for b in range(256))
_PAD_OUT = bytes(b ^ 0x5C for b in range(256))


def hmac_sha256(key, message):
    """RFC 2104 over the builtin SHA-256 (the hmac module loads OpenSSL: 3-4 ms per run)."""
    try:
        from _sha256 import sha256
    except ImportError:
        try:
            from _sha2 import sha256
        except ImportError:
            from hashlib import sha256
    if len(key) > 64:
        key = sha256(key).digest()
    key = key.ljust(64, b'\0')
    inner = sha256(key.translate(_PAD_IN) + message).digest()
    return sha256(key.translate(_PAD_OUT) + inner).hexdigest()


def read_all(fd):
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b''.join(chunks)
        chunks.append(chunk)


def limit_process(setup):
    """What the submission's process gets before it runs anything: the run's limits, code_gen's
    integer-string limit and environment, and no payload file left behind."""
    limits = setup.get('limits') or {}
    for kind, key in ((resource.RLIMIT_NPROC, 'processes'), (resource.RLIMIT_FSIZE, 'file_bytes'),
                      (resource.RLIMIT_CPU, 'cpu_seconds'), (resource.RLIMIT_AS, 'memory_bytes')):
        if limits.get(key):
            cap_limit(kind, int(limits[key]))
    sys.set_int_max_str_digits(50000)
    os.environ['TOKENIZERS_PARALLELISM'] = 'false'
    forget_stdin_file()


def isolate_child(channel):
    """Descriptors 0-2 of /dev/null, the channel's write end at 3 and nothing else."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    if channel != 3:
        os.dup2(channel, 3)
        os.close(channel)
    os.closerange(4, 1 << 16)
    sys.stdin = open(os.devnull)


def main(setup):
    """`setup` (code, inputs, fn_name, timeout, limits) has been read. With `channel` set, this
    process is the child itself and descriptor 3 its channel to a grader on the host (`host`),
    which alone ever holds the expected outputs. Otherwise the rest of stdin is the secret part
    (expected outputs and the result key), read only after the child exists: this process is the
    grading parent."""
    limit_process(setup)
    if setup.get('channel'):
        status = 1
        try:
            isolate_child(3)
            child(3, setup)
            status = 0
        finally:
            # Threads or atexit hooks the program left behind cannot send anything more.
            os._exit(status)
    if not set_dumpable(False) and sys.platform.startswith('linux'):
        # Dumpable, the parent's memory and descriptors (the payload) would be open to the child.
        os._exit(3)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.close(read_end)
            # What the program writes to descriptors 1 and 2 is dropped, its descriptor 0 is empty,
            # and it holds no descriptor of the parent's (the payload, the result channel).
            isolate_child(write_end)
            set_dumpable(True)
            child(3, setup)
            status = 0
        finally:
            # Threads or atexit hooks the program left behind cannot send anything more.
            os._exit(status)
    os.close(write_end)
    write, dumps, exit_now = os.write, json.dumps, os._exit
    secret = json.loads(read_all(0))
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    key = secret['key'].encode('ascii')
    sys.setrecursionlimit(20000)  # nested returned values, decoded here
    try:
        results, metadata = drive(grade(Reader(), setup, secret['outputs']), read_end)
    except Exception:
        # The child died, stopped or sent something else than its outputs: no result, as code_gen
        # reports when its worker leaves none.
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
        exit_now(1)
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
    body = dumps({'result': [plain(r) for r in results], 'metadata': metadata}, default=str)
    tag = hmac_sha256(key, body.encode('utf-8', 'surrogatepass'))
    data = (tag + ' ' + body + '\n').encode('utf-8', 'surrogatepass')
    while data:
        data = data[write(1, data):]
    exit_now(0)


# The host side's bounds on one channel: a message longer than this is a flood (no result), as
# is a run whose grading takes more CPU than CHANNEL_CPU_SECONDS (`rollserve_forkserver`'s
# grader). A stdio test's output is sent as JSON (non-ASCII escaped: up to 6 bytes a character,
# a returned value tagged: up to ≈ 12 bytes an element), hence the multiple of the largest
# expected output; the floor keeps any answer a real program prints (100 MB of it is a wrong answer).
MESSAGE_FLOOR = 256 * 1024 * 1024
MESSAGE_PER_EXPECTED = 16


def host(data):
    """The grader of one child's channel, run on the host by the fork server's grader process
    (never in a sandbox, never in a process a sandbox's program is forked from): `data` is what
    the service sent it after the child was forked (inputs, fn_name and the expected outputs);
    the generator is sent the channel's bytes as they come and returns the verdict, with the same
    comparisons as the grading parent's. Raising (the child died, stopped early, sent anything
    else or too much) is no verdict: the run's global failure."""
    sys.setrecursionlimit(20000)  # nested returned values, decoded here (as in the parent)
    sys.set_int_max_str_digits(50000)
    outputs = data['outputs']
    largest = max((len(o) for o in outputs), default=0)
    reader = Reader(MESSAGE_FLOOR + MESSAGE_PER_EXPECTED * largest)
    results, metadata = yield from grade(reader, data, outputs)
    return {'result': [plain(r) for r in results], 'metadata': metadata}


def prepare():
    """Run once by a fork server that made this module (runner.ts's preload), before any fork:
    the parent's and child's pure steps on a sample program, so that each forked run finds their
    code specialised and their lazily made parts made, rather than writing (and copying) those
    pages itself. Nothing here touches what a program finds: no module is imported, no global
    changed, the decimal arithmetic runs in a context of its own."""
    import ctypes
    import decimal
    if not _libc:
        _libc.append(ctypes.CDLL(None, use_errno=True))
    sample = ('import sys\nfrom typing import List\ndef main():\n    data = sys.stdin.read().split()\n'
              '    print(sum(int(x) for x in data), [1.5, (2, "a")])\nif __name__ == "__main__":\n    main()\n')
    for _ in range(3):
        compile(as_function(drop_main_guard(sample)), '<string>', 'exec')
        compile(PREAMBLE + '\n\nclass Solution:\n    def f(self, x):\n        return x\n', '<string>', 'exec')
        setup = json.loads(json.dumps({'code': sample, 'inputs': ['3\n1 2 3\n'], 'fn_name': None, 'timeout': 10}))
        message = describe([1, 2.5, (3, 'x'), {'k': {4}}])
        decode(json.loads(json.dumps(message))['value'])
        with decimal.localcontext():
            for expected, predicted in (('6 1.5', '6 1.5000001'), ('7', '7')):
                expected_lines, predicted_lines = stripped_lines(expected), stripped_lines(predicted)
                for e, p in zip(expected_lines, predicted_lines):
                    ok_e, e_numbers = to_decimals(e)
                    ok_p, p_numbers = to_decimals(p)
                    decimal_lines_match(e.split(), p.split(), e_numbers, p_numbers)
        close_floats(1.0, 1.0000001)
        # the host side's grading of a channel, fed a child's messages in two chunks
        stream = frame({'t': 'ready'}) + frame({'t': 'output', 'output': '6 [1.5, (2, "a")]\n', 'time': 0.001})
        for fn_name, inputs, outputs, data in ((None, ['3\n1 2 3\n'], ['6 [1.5, (2, "a")]\n'], stream),
                                               ('f', ['[1, 2]'], ['[1, 2]'], frame({'t': 'ready'}) + frame(dict(message, time=0.001)))):
            steps = host({'inputs': inputs, 'fn_name': fn_name, 'outputs': outputs})
            try:
                next(steps)
                steps.send(data[:7])
                steps.send(data[7:])
                steps.send(b'')
            except (StopIteration, EOFError, ProtocolError):
                pass
        shorten('x' * 400)
        hmac_sha256(b'k' * 64, json.dumps({'result': [True], 'metadata': setup}, default=str).encode())

