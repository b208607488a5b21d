import { describe, expect, it } from 'vitest';
import { assertBindAllowed, checkToken, isLoopbackHost } from './bind-policy.ts';

describe('bind policy', () => {
  it('knows loopback addresses', () => {
    for (const host of ['127.0.0.1', '127.8.9.10', 'localhost', '::1', '[::1]', '0:0:0:0:0:0:0:1', '::ffff:127.0.0.1']) expect(isLoopbackHost(host), host).toBe(true);
    for (const host of ['0.0.0.0', '::', '10.1.2.3', '192.168.0.1', 'example.org', '128.0.0.1']) expect(isLoopbackHost(host), host).toBe(false);
  });

  it('refuses a non-loopback address without a token unless allowed', () => {
    expect(() => assertBindAllowed({ host: '0.0.0.0' })).toThrow(/refusing to serve 0\.0\.0\.0 without a token.*--allow-no-token/);
    expect(() => assertBindAllowed({ host: '10.0.0.5', token: 'secret' })).not.toThrow();
    expect(() => assertBindAllowed({ host: '0.0.0.0', allowNoToken: true })).not.toThrow();
    expect(() => assertBindAllowed({ host: '127.0.0.1' })).not.toThrow();
  });

  it('takes only tokens a Bearer header can carry', () => {
    expect(checkToken('abc-DEF_1.2~3+4/5==')).toBe('abc-DEF_1.2~3+4/5==');
    for (const token of ['', 'has space', 'quote"', 'a=b']) expect(() => checkToken(token), token).toThrow(/the token must be/);
  });
});
