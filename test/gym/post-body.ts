import { connect } from 'node:net';

// A client that sends large request bodies as a flood does (HTTP/1.1 over a plain socket, so that
// it keeps writing however the server answers), to see when the server answers and what it reads.

export interface Sent {
  status: number;
  body: string;
  /** Body bytes the client had written when the answer came. */
  writtenAtAnswer: number;
  /** Whether the server closed or reset the connection before the client wrote everything. */
  cut: boolean;
  /** Body bytes the client wrote in all. */
  written: number;
}

/**
 * POSTs `total` body bytes (not JSON) in 64 KiB writes, with Content-Length `declared` or chunked,
 * on a keep-alive connection. With `hold`, the body is never ended: writing stops once the answer
 * is in, so an answer proves the server did not wait for the end. With `keepSending`, writing goes
 * on after the answer until `total` or until the server cuts the connection.
 */
export function post(
  url: string,
  path: string,
  {
    total,
    declared,
    hold = false,
    keepSending = false,
    headers = {},
  }: { total: number; declared?: number; hold?: boolean; keepSending?: boolean; headers?: Record<string, string> },
): Promise<Sent> {
  return new Promise((resolve, reject) => {
    const { hostname, port } = new URL(url);
    const socket = connect(Number(port), hostname);
    const chunked = declared === undefined;
    let written = 0;
    let answer: { status: number; body: string; writtenAtAnswer: number } | undefined;
    let cut = false;
    let why = '';
    let received = Buffer.alloc(0);
    const chunk = Buffer.alloc(64 * 1024, 'a');
    chunk[0] = 0x5b; // '[': not JSON either way
    const framed = (piece: Buffer) => (chunked ? Buffer.concat([Buffer.from(`${piece.length.toString(16)}\r\n`), piece, Buffer.from('\r\n')]) : piece);
    let settled = false;
    const finish = () => {
      if (settled) return;
      settled = true;
      socket.destroy();
      if (answer) resolve({ ...answer, cut, written });
      else reject(new Error(`${path}: connection cut before any answer (${why || 'closed'}, ${written} bytes written)`));
    };
    socket.on('data', (data: Buffer) => {
      if (answer) return;
      received = Buffer.concat([received, data]);
      const head = received.indexOf('\r\n\r\n');
      if (head < 0) return;
      const lines = received.subarray(0, head).toString('latin1').split('\r\n');
      const status = Number(lines[0]!.split(' ')[1]);
      if (status === 100) {
        received = received.subarray(head + 4);
        return;
      }
      const length = Number(/^content-length:\s*(\d+)$/im.exec(lines.join('\n'))?.[1] ?? 0);
      if (received.length < head + 4 + length) return;
      answer = { status, body: received.subarray(head + 4, head + 4 + length).toString('utf8'), writtenAtAnswer: written };
      if (keepSending) pump();
      else finish();
    });
    socket.on('error', (error: NodeJS.ErrnoException) => {
      why = error.code ?? error.message;
      cut = true;
      finish();
    });
    socket.on('close', () => {
      if (written < total) cut = true;
      finish();
    });
    socket.on('end', () => {
      if (written < total) cut = true;
      finish();
    });
    const pump = () => {
      while ((!answer || keepSending) && !settled && written < total) {
        const piece = chunk.subarray(0, Math.min(chunk.length, total - written));
        written += piece.length;
        if (!socket.write(framed(piece))) return void socket.once('drain', pump);
      }
      if (settled || (answer && !keepSending)) return;
      if (written >= total && !hold) socket.write(chunked ? '0\r\n\r\n' : '');
      else if (written >= total && keepSending && answer) finish();
    };
    const head = [
      `POST ${path} HTTP/1.1`,
      `Host: ${hostname}:${port}`,
      'Connection: keep-alive',
      'Content-Type: application/json',
      ...Object.entries(headers).map(([name, value]) => `${name}: ${value}`),
      chunked ? 'Transfer-Encoding: chunked' : `Content-Length: ${declared}`,
    ];
    socket.once('connect', () => {
      socket.write(`${head.join('\r\n')}\r\n\r\n`);
      pump();
    });
  });
}
