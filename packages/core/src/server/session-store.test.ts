import { afterEach, describe, expect, it } from 'vitest';
import { SessionStore } from './session-store.ts';

const stores: SessionStore[] = [];
afterEach(async () => {
  await Promise.all(stores.splice(0).map((s) => s.close()));
});

describe('session store', () => {
  it('closes a resource registered after the session ended at once', async () => {
    const store = new SessionStore();
    stores.push(store);
    const session = store.get('s1');
    const closed: string[] = [];
    session.onClose(() => void closed.push('first'));
    await store.end('s1');
    expect(closed).toEqual(['first']);
    session.onClose(() => void closed.push('late')); // a tool that outlived its limit
    await new Promise((r) => setTimeout(r, 10));
    expect(closed).toEqual(['first', 'late']);
    expect(store.size).toBe(0);
  });

  it('does not reap a session while a request is being served for it', async () => {
    const store = new SessionStore({ idleTtlMs: 1_000 });
    stores.push(store);
    store.get('busy');
    store.get('idle');
    store.use('busy', true);
    const later = Date.now() + 10_000;
    expect(await store.reap(later)).toBe(1);
    expect(store.has('busy')).toBe(true);
    expect(store.has('idle')).toBe(false);
    store.use('busy', false);
    expect(await store.reap(Date.now() + 10_000)).toBe(1);
  });

  it('rejects forged cookies and accepts quoted ones', () => {
    const store = new SessionStore();
    stores.push(store);
    const value = store.newCookieValue();
    const id = value.slice(0, value.lastIndexOf('.'));
    expect(store.idFromCookie(value)).toBe(id);
    expect(store.idFromCookie(`"${value}"`)).toBe(id);
    expect(store.idFromCookie(`${id}.${'0'.repeat(32)}`)).toBeUndefined();
    expect(store.idFromCookie(undefined)).toBeUndefined();
  });
});
