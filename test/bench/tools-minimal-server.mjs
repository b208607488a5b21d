import { createServer } from 'node:http';
import { BashSession, createBwrapProvider } from '@rollserve/core/sandbox';

// The least any HTTP face over the bash backend can cost here, as the floor under `pnpm bench
// tools`' figures (issue 16): node:http and the very BashSession rollserve uses, one session per
// cookie, and nothing else — no routing, no validation, no signed cookie, no time limit, no error
// shapes. Not a server to use: it answers nothing but the bench's calls. Prints its URL as
// tools-server.mjs does, on the same build of @rollserve/core.

const provider = createBwrapProvider();
const sessions = new Map();
let next = 0;

const server = createServer((req, res) => {
  const chunks = [];
  req.on('data', (chunk) => chunks.push(chunk));
  req.on('end', () => {
    if (req.url === '/seed_session') {
      res.writeHead(200, { 'content-type': 'application/json', 'set-cookie': `s=${next++}` }).end('{}');
      return;
    }
    const id = /(?:^|;\s*)s=(\d+)/.exec(req.headers.cookie ?? '')?.[1] ?? 'none';
    let session = sessions.get(id);
    if (session === undefined) {
      session = provider.create().then(async (sandbox) => {
        const bash = await BashSession.start(sandbox);
        return { bash, close: async () => (await bash.close(), await sandbox.close()) };
      });
      sessions.set(id, session);
    }
    const { command } = JSON.parse(Buffer.concat(chunks).toString());
    void session
      .then(({ bash }) => bash.run(command))
      .then(
        (result) => res.writeHead(200, { 'content-type': 'text/plain' }).end(result.output),
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
  void Promise.allSettled([...sessions.values()].map(async (session) => (await session).close())).then(() => process.exit(0));
});
