import { describe, expect, it } from 'vitest';
import {
  decodeInTurn,
  decodeRequestBodyInTurn,
  MAX_INT_DIGITS,
  MAX_JSON_DEPTH,
  parseJsonLikePython,
  pythonJsonLimitAt,
  pythonJsonLimitAtYielding,
  readRequestBody,
} from './read-body.ts';

const nested = (depth: number) => '['.repeat(depth) + ']'.repeat(depth);
const post = (body: string | Uint8Array, contentType?: string) =>
  new Request('http://x/', { method: 'POST', body, headers: contentType === undefined ? {} : { 'content-type': contentType } });

describe('parseJsonLikePython', () => {
  it('parses what json.loads parses', () => {
    expect(parseJsonLikePython(nested(MAX_JSON_DEPTH))).toMatchObject({ kind: 'json' });
    expect(parseJsonLikePython(`{"a":${'9'.repeat(MAX_INT_DIGITS)},"b":${'1'.repeat(9_000)}.5,"c":"${'['.repeat(5_000)}\\\\"}`)).toMatchObject({ kind: 'json' });
  });

  it('gives up where json.loads raises a RecursionError or ValueError', () => {
    expect(parseJsonLikePython(nested(MAX_JSON_DEPTH + 1))).toEqual({ kind: 'unparseable' });
    expect(parseJsonLikePython('['.repeat(100_000))).toEqual({ kind: 'unparseable' });
    expect(parseJsonLikePython(`[-${'1'.repeat(MAX_INT_DIGITS + 1)}]`)).toEqual({ kind: 'unparseable' });
    expect(pythonJsonLimitAt(`"\\"[[[" ${nested(MAX_JSON_DEPTH + 1)}`)).toBe(8 + MAX_JSON_DEPTH);
  });

  it('reports a syntax error before the limit as json_invalid, at its position', () => {
    expect(parseJsonLikePython(`{x ${nested(5_000)}`)).toMatchObject({ kind: 'invalid', error: { type: 'json_invalid', loc: ['body', 1] } });
    expect(parseJsonLikePython('   ')).toMatchObject({ kind: 'invalid', error: { loc: ['body', 3] } });
  });
});

describe('readRequestBody', () => {
  it('reads JSON only when the content type says JSON or says nothing, as FastAPI does', async () => {
    expect(await readRequestBody(post('{"a":1}', 'application/json; charset=utf-8'))).toEqual({ kind: 'json', value: { a: 1 } });
    expect(await readRequestBody(post('{"a":1}', 'application/vnd.x+json'))).toEqual({ kind: 'json', value: { a: 1 } });
    expect(await readRequestBody(new Request('http://x/', { method: 'POST', body: new Uint8Array(Buffer.from('{"a":1}')) }))).toMatchObject({ kind: 'json' });
    expect(await readRequestBody(post('{"a":1}', 'text/plain'))).toEqual({ kind: 'text', value: '{"a":1}' });
    expect(await readRequestBody(post('', 'application/json'))).toEqual({ kind: 'absent' });
  });

  it('drops a UTF-8 BOM and refuses bytes that are not UTF-8', async () => {
    expect(await readRequestBody(post(Buffer.from([0xef, 0xbb, 0xbf, 0x7b, 0x7d]), 'application/json'))).toEqual({ kind: 'json', value: {} });
    expect(await readRequestBody(post(Buffer.from([0x7b, 0xff, 0x7d]), 'application/json'))).toEqual({ kind: 'unparseable' });
  });
});

describe('large bodies', () => {
  const bytes = (text: string) => new Uint8Array(Buffer.from(text));
  const padding = (n: number) => `"${'p'.repeat(n)}"`;

  it('decode in turn to what json.loads makes of them, limits found across scan slices', async () => {
    // a limit just past 512 KiB, 1 MiB and 2 MiB into the text, after a syntax-valid prefix
    for (const at of [512 * 1024 - 3, 1024 * 1024 + 7, 2 * 1024 * 1024]) {
      const deep = `[${padding(at)},${nested(MAX_JSON_DEPTH + 5)}]`;
      expect(await decodeRequestBodyInTurn(bytes(deep), 'application/json')).toEqual({ kind: 'unparseable' });
      expect(await decodeRequestBodyInTurn(bytes(`${deep.slice(0, -1)}x`), null)).toEqual({ kind: 'unparseable' });
      const digits = `[${padding(at)},${'7'.repeat(MAX_INT_DIGITS + 1)}]`;
      expect(await decodeRequestBodyInTurn(bytes(digits), null)).toEqual({ kind: 'unparseable' });
      // the syntax error first: 422
      expect(await decodeRequestBodyInTurn(bytes(`[${padding(at)},x,${nested(MAX_JSON_DEPTH + 5)}]`), null)).toMatchObject({ kind: 'invalid', error: { type: 'json_invalid' } });
      // within the limits: the value
      const fine = `[${padding(at)},${nested(MAX_JSON_DEPTH - 1)},${'7'.repeat(MAX_INT_DIGITS)},1e999]`;
      expect(await decodeRequestBodyInTurn(bytes(fine), null)).toMatchObject({ kind: 'json' });
      expect(parseJsonLikePython(fine)).toMatchObject({ kind: 'json' });
    }
  });

  it('scans as the one-pass scan does', async () => {
    for (const text of [`"\\"[[[" ${nested(MAX_JSON_DEPTH + 1)}`, `[-${'1'.repeat(MAX_INT_DIGITS + 1)}]`, '"unterminated', nested(10)]) {
      expect(await pythonJsonLimitAtYielding(text)).toBe(pythonJsonLimitAt(text));
    }
  });

  it('let other work run while one is decoded, and are decoded one at a time', async () => {
    const big = bytes(`[${Array.from({ length: 400_000 }, (_, i) => i).join(',')},x]`);
    const order: string[] = [];
    const first = decodeInTurn(big.length, async () => {
      order.push('first starts');
      const body = await decodeRequestBodyInTurn(new Uint8Array(0), null);
      order.push('first ends');
      return body;
    });
    const second = decodeInTurn(big.length, () => void order.push('second'));
    const small = decodeInTurn(10, () => void order.push('small'));
    await Promise.all([first, second, small]);
    expect(order).toEqual(['small', 'first starts', 'first ends', 'second']);
    expect(await decodeRequestBodyInTurn(big, null)).toMatchObject({ kind: 'invalid' });
  });
});
