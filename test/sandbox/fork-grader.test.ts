import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

// The fork server's grader loop (packages/core/python/rollserve_forkserver.py `_grader`), run
// alone: a host function that never finishes is cut at its CPU budget and answered with an error,
// and the grader goes on serving the other channels; a channel whose grading is held busy without
// end delays no other channel's answer, and its process ends with its drop or the grader's end. (Its place in the sandboxes' path, and what a
// program can and cannot do to it: kernel-fork.test.ts and environments/code's runner tests.)

const SERVER = fileURLToPath(new URL('../../packages/core/python/rollserve_forkserver.py', import.meta.url));

// Both scripts: the fork server's module loaded, a host function ("spin" never ends, else the
// channel's bytes up to a '.'), and its grader forked with the script holding the other ends.
const grader = (budget: number) => `
import json, os, socket, sys
g = {"__name__": "rollserve_forkserver"}
exec(compile(open(sys.argv[1]).read(), "rollserve_forkserver.py", "exec"), g)
g["CHANNEL_CPU_SECONDS"] = ${budget.toFixed(1)}
g["socket"] = socket

def host(data):
    got = b""
    while True:
        chunk = yield
        if not chunk:
            raise EOFError("the channel ended")
        got += chunk
        if data == "spin":
            while True:
                pass
        if got.endswith(b"."):
            return {"got": got.decode(), "data": data}

ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
requests_r, requests_w = os.pipe()
answers_r, answers_w = os.pipe()
pid = os.fork()
if pid == 0:
    ours.close(); os.close(requests_w); os.close(answers_r)
    try:
        g["_grader"](theirs, requests_r, answers_w, host)
    finally:
        os._exit(1)
theirs.close(); os.close(requests_r); os.close(answers_w)

def read_answers(count):
    """The grader's answers by channel id, until count came or the pipe ended; and what is left unread of a line."""
    answers = {}
    buffer = b""
    while len(answers) < count:
        chunk = os.read(answers_r, 65536)
        if not chunk:
            break
        buffer += chunk
        while b"\\n" in buffer:
            line, buffer = buffer.split(b"\\n", 1)
            message = json.loads(line)
            answers[message.pop("id")] = message
    return answers, buffer

`;

const SCRIPT = `
${grader(0.3)}writers = {}
for cid in (1, 2, 3):
    r, w = os.pipe()
    socket.send_fds(ours, [json.dumps({"id": cid}).encode()], [r])
    os.close(r)
    writers[cid] = w
# data before or after the descriptor: either order
for cid, data in ((1, "spin"), (2, "echo"), (3, "early")):
    os.write(requests_w, (json.dumps({"id": cid, "data": data}) + "\\n").encode())
os.write(writers[1], b"x")
os.write(writers[2], b"hello")
os.write(writers[2], b", grader.")
os.close(writers[3])
answers, buffer = read_answers(3)
os.close(requests_w)
_, status = os.waitpid(pid, 0)
print(json.dumps({"answers": answers, "exit": os.waitstatus_to_exitcode(status)}))
`;

describe('the fork server grader', () => {
  it('cuts a host function at its CPU budget with an error, and serves the other channels on', () => {
    const run = spawnSync('python3', ['-c', SCRIPT, SERVER], { encoding: 'utf8', timeout: 60_000 });
    expect(run.stderr).toBe('');
    const out = JSON.parse(run.stdout) as { answers: Record<string, unknown>; exit: number };
    expect(out.answers).toEqual({
      '1': { error: expect.stringContaining('more than 0.3 s of CPU') },
      '2': { result: { got: 'hello, grader.', data: 'echo' } },
      '3': { error: 'EOFError: the channel ended' },
    });
    expect(out.exit).toBe(0); // its requests' end: the service is gone
  });

  it("answers every other channel while one channel's grading never ends; that grading ends with its drop, none outlives the grader", () => {
    const run = spawnSync('python3', ['-c', HELD, SERVER], { encoding: 'utf8', timeout: 120_000 });
    expect(run.stderr).toBe('');
    const out = JSON.parse(run.stdout) as { answers: Record<string, unknown>; held: number[]; killed: number[]; exit: number; left: number[] };
    // every innocent channel answered while the held one was still being graded (one process)
    expect(out.answers).toEqual({
      '2': { result: { got: 'two.', data: 'echo' } },
      '3': { result: { got: 'three.', data: 'echo' } },
      '4': { error: 'EOFError: the channel ended' },
      '5': { result: { got: 'five.', data: 'echo' } },
    });
    expect(out.held).toHaveLength(1);
    // the held channel's drop killed its grading; no answer came for it, and nothing is left
    expect(out.killed).toEqual(out.held);
    expect(out.exit).toBe(0);
    expect(out.left).toEqual([]);
  });
});

// Channel 1's grading spins without end (no CPU budget that would cut it here): channels 2-5,
// whose descriptors and data come after it, are answered all the same. The script is the
// grader's subreaper, so any grading process that outlived its grader would be reaped (and
// counted) here.
const HELD = `
import ctypes
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
${grader(100000.0)}writers = {}
def channel(cid, data):
    r, w = os.pipe()
    socket.send_fds(ours, [json.dumps({"id": cid}).encode()], [r])
    os.close(r)
    writers[cid] = w
    os.write(requests_w, (json.dumps({"id": cid, "data": data}) + "\\n").encode())
channel(1, "spin")
os.write(writers[1], b"x")
for cid in (2, 3, 4, 5):
    channel(cid, "echo")
os.write(writers[2], b"two.")
os.write(writers[3], b"thr")
os.write(writers[3], b"ee.")
os.close(writers[4])
os.write(writers[5], b"five.")
answers, buffer = read_answers(4)
# channel 1 is still being graded: the grader's one child
with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
    held = [int(p) for p in f.read().split()]
os.write(requests_w, b'{"drop": 1}\\n')
killed = []
for child in held:
    # (the grader reaps it: wait for its end as the grader's children list)
    while True:
        with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
            if str(child) not in f.read().split():
                break
        os.sched_yield()
    killed.append(child)
os.close(requests_w)
_, status = os.waitpid(pid, 0)
left = []
while True:
    try:
        left.append(os.waitpid(-1, 0)[0])
    except ChildProcessError:
        break
os.set_blocking(answers_r, False)
try:
    rest = os.read(answers_r, 65536)
except BlockingIOError:
    rest = b""
for line in (buffer + rest).split(b"\\n"):
    if line:
        message = json.loads(line)
        answers[message.pop("id")] = message
print(json.dumps({"answers": answers, "held": held, "killed": killed, "exit": os.waitstatus_to_exitcode(status), "left": left}))
`;
