import { Hono } from 'hono';
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { RolloutError } from '../errors.ts';
import { fastApiErrorAnswer, FastApiReply, validateBody } from './fastapi.ts';
import { fastApiErrorHandler, parseFastApiBody, readBodyBytes } from './fastapi-hono.ts';
import { BodyTooLargeError } from './read-body.ts';

const silent = { error: () => undefined };

describe('the FastAPI layer', () => {
  it('validates against every model at once, a JSON null being no body', () => {
    const a = z.object({ x: z.number() });
    const b = z.object({ y: z.string() });
    expect(validateBody([a, b], { x: 1, y: 'y' })).toEqual([{ x: 1 }, { y: 'y' }]);
    const both = (() => {
      try {
        validateBody([a, b], {});
      } catch (error) {
        return error as FastApiReply;
      }
    })();
    expect(both).toMatchObject({ status: 422, body: { detail: [{ type: 'missing', loc: ['body', 'x'] }, { type: 'missing', loc: ['body', 'y'] }] } });
    expect(() => validateBody([a], null)).toThrow(FastApiReply);
  });

  it('answers a service refusal as an HTTPException only where asked, an environment bug as repr(e)', () => {
    const conflict = new RolloutError({ code: 'CONFLICT', message: 'taken' });
    expect(fastApiErrorAnswer(conflict, { httpExceptions: true })).toEqual({ status: 409, body: { detail: 'taken' } });
    expect(fastApiErrorAnswer(conflict)).toMatchObject({ status: 500, unhandled: true });
    expect(fastApiErrorAnswer(new RangeError('bad'))).toEqual({ status: 500, body: "RangeError('bad')", unhandled: true });
    expect(fastApiErrorAnswer(new BodyTooLargeError(10))).toEqual({ status: 413, body: { detail: 'Request Entity Too Large: the body may be at most 10 bytes' } });
    const unprocessable = new RolloutError({ code: 'UNPROCESSABLE', message: 'no', details: { image: 'x' } });
    expect(fastApiErrorAnswer(unprocessable)).toMatchObject({ status: 422, body: { detail: [{ type: 'value_error', loc: ['body'], msg: 'Value error, no' }] } });
  });

  it('reads a body once: a route after a middleware that read it gets the same bytes', async () => {
    const app = new Hono();
    app.onError(fastApiErrorHandler({ logger: silent }));
    app.use(async (c, next) => {
      await readBodyBytes(c, 1024);
      await next();
    });
    app.post('/echo', async (c) => c.json((await parseFastApiBody(c, z.object({ text: z.string() }))).value));
    const post = (body: string) => app.request('/echo', { method: 'POST', body, headers: { 'content-type': 'application/json' } });
    expect(await (await post('{"text":"hi"}')).json()).toEqual({ text: 'hi' });
    const invalid = await post('{"text":');
    expect(invalid.status).toBe(422);
    expect(await invalid.json()).toMatchObject({ detail: [{ type: 'json_invalid' }] });
    expect((await post(JSON.stringify({ text: 'x'.repeat(2048) }))).status).toBe(413);
  });
});
