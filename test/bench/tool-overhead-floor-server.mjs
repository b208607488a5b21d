import { createServer } from 'node:http';
import { BashSession, createBwrapProvider, PythonKernel } from '@rollserve/core/sandbox';

// The floor under `pnpm bench tool-overhead`: the least HTTP face over the very backend the
// resources server uses (the default bwrap provider, one sandbox per session with its own
// BashSession and PythonKernel, started at the session's first call of each), on node:http with
// nothing else: no framework, no validation, no signed cookie, no time limit, no error shapes.
// Not a server to use: it answers nothing but the bench's calls, with the backend's result as JSON.

const provider = createBwrapProvider();
const sessions = new Map();
let next = 0;

function sessionOf(id) {
  let session = sessions.get(id);
  if (session === undefined) {
    const sandbox = provider.create();
    let bash;
    let python;
    session = {
      bash: () => (bash ??= sandbox.then((s) => BashSession.start(s))),
      python: () => (python ??= sandbox.then((s) => PythonKernel.start(s))),
      close: async () => {
        await Promise.allSettled([bash, python].filter(Boolean).map(async (tool) => (await tool).close()));
        await (await sandbox).close();
      },
    };
    sessions.set(id, session);
  }
  return session;
}

const server = createServer((req, res) => {
  const chunks = [];
  req.on('data', (chunk) => chunks.push(chunk));
  req.on('end', () => {
    if (req.url === '/seed_session') {
      res.writeHead(200, { 'content-type': 'application/json', 'set-cookie': `s=${next++}` }).end('{}');
      return;
    }
    const session = sessionOf(/(?:^|;\s*)s=(\d+)/.exec(req.headers.cookie ?? '')?.[1] ?? 'none');
    const body = JSON.parse(Buffer.concat(chunks).toString());
    const result = req.url === '/execute_python'
      ? session.python().then((kernel) => kernel.run(body.code))
      : session.bash().then((bash) => bash.run(body.command));
    void result.then(
      (value) => res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(value)),
      (error) => res.writeHead(500).end(String(error)),
    );
  });
});
server.keepAliveTimeout = 30_000;
server.listen(0, '127.0.0.1', () => {
  const address = server.address();
  console.log(`serving http://127.0.0.1:${typeof address === 'object' && address ? address.port : 0}`);
});
process.once('SIGTERM', () => {
  server.close();
  server.closeAllConnections();
  void Promise.allSettled([...sessions.values()].map((session) => session.close())).then(() => process.exit(0));
});
