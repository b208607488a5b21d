import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { getRequestListener } from '@hono/node-server';

export interface ServeOptions {
  /** @default '127.0.0.1' */
  host?: string;
  /** 0 picks a free port. @default 0 */
  port?: number;
  /** Listen on a Unix domain socket instead of TCP. */
  socketPath?: string;
}

export interface RunningServer {
  /** `http://host:port` (or `unix:<path>` for a socket). */
  readonly url: string;
  readonly host: string;
  readonly port: number;
  readonly server: Server;
  /** Stops listening and drops every open connection. */
  close(): Promise<void>;
}

/**
 * A handler that may answer a request on Node's own objects before the fetch handler sees it (the
 * resources server's tool calls: @hono/node-server's web Request, Hono's context and the web
 * Headers cost more than the rest of such a call's HTTP handling). False: not its request, left
 * untouched for the fetch handler. True: it answers, or hands the request to the fetch handler
 * with `fallback()` (the body it read kept for the app: see readIncomingBytes).
 */
export type NodeFastPath = (incoming: IncomingMessage, outgoing: ServerResponse, fallback: () => void) => boolean;

/**
 * Serves a fetch handler (a Hono app) with the Node settings NeMo Gym's client needs
 * (CONTRACT.md §1.10): keep-alive longer than the client's 15 s, no request time limit (a SWE
 * /verify may take an hour). Bodies are capped by the apps themselves (`maxBodyBytes` of the
 * resources server and the rollout API: a 413 in each face's shape).
 */
export async function serveFetch(
  app: { fetch: (request: Request) => Response | Promise<Response>; fastPath?: NodeFastPath },
  { host = '127.0.0.1', port = 0, socketPath }: ServeOptions = {},
): Promise<RunningServer> {
  const listener = getRequestListener(app.fetch);
  const fast = app.fastPath;
  // A request handed back has had its body read: @hono/node-server must not wait for the body's
  // end (it came) nor drain it after the answer (it would cut the connection 500 ms later).
  const handedBack = fast ? getRequestListener(app.fetch, { autoCleanupIncoming: false }) : listener;
  const server = createServer(
    fast
      ? (incoming, outgoing) => {
          if (!fast(incoming, outgoing, () => void handedBack(incoming, outgoing))) void listener(incoming, outgoing);
        }
      : listener,
  );
  server.keepAliveTimeout = 30_000;
  server.headersTimeout = 31_000;
  server.requestTimeout = 0;
  server.maxHeadersCount = 0;
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    const done = () => {
      server.off('error', reject);
      resolve();
    };
    if (socketPath) server.listen(socketPath, done);
    else server.listen(port, host, done);
  });
  const address = server.address();
  const boundPort = typeof address === 'object' && address ? address.port : 0;
  const urlHost = host.includes(':') ? `[${host}]` : host;
  return {
    url: socketPath ? `unix:${socketPath}` : `http://${urlHost}:${boundPort}`,
    host,
    port: boundPort,
    server,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}
