import type { Server } from 'node:http';
import { createAdaptorServer } from '@hono/node-server';

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
 * Serves a fetch handler (a Hono app) with the Node settings NeMo Gym's client needs
 * (CONTRACT.md §1.10): keep-alive longer than the client's 15 s, no request time limit (a SWE
 * /verify may take an hour). Bodies are capped by the apps themselves (`maxBodyBytes` of the
 * resources server and the rollout API: a 413 in each face's shape).
 */
export async function serveFetch(
  app: { fetch: (request: Request) => Response | Promise<Response> },
  { host = '127.0.0.1', port = 0, socketPath }: ServeOptions = {},
): Promise<RunningServer> {
  const server = createAdaptorServer({ fetch: app.fetch }) as Server;
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
