import { describe, expect, it } from 'vitest';
import { MAX_INT_DIGITS, MAX_JSON_DEPTH, parseJsonLikePython, pythonJsonLimitAt, readRequestBody } from './read-body.ts';

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
