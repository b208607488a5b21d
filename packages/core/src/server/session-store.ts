import { createHmac, randomBytes, randomUUID, timingSafeEqual } from 'node:crypto';
import type { Logger } from 'pino';
import type { Session } from '../spec/environment.ts';

/** Verified cookie values remembered, oldest dropped first (a few MB at most). */
const VERIFIED_CACHE_SIZE = 16_384;

interface SessionRecord {
  session: Session;
  closers: Array<() => Promise<void> | void>;
  lastUsed: number;
  /** Requests being served for it: the reaper leaves a busy session alone. */
  busy: number;
}

export interface SessionStoreOptions {
  /** Sessions idle longer than this are closed by the reaper. @default 3_600_000 (1 h) */
  idleTtlMs?: number;
  logger?: Logger;
}

/**
 * Per-rollout sessions, keyed by the id carried in the session cookie. The cookie value is
 * `<uuid>.<hmac hex>`: only characters that aiohttp and Python's SimpleCookie round-trip unchanged
 * (CONTRACT.md §1.3). A cookie with a bad signature starts a new session, as Starlette's does.
 */
export class SessionStore {
  readonly #records = new Map<string, SessionRecord>();
  readonly #secret = randomBytes(32);
  readonly #idleTtlMs: number;
  readonly #logger: Logger | undefined;
  readonly #reaper: NodeJS.Timeout;
  readonly #ended = new WeakMap<Session, () => void>();
  /** Cookie values already verified (a pure function of the value, so safe to remember). */
  readonly #verified = new Map<string, string>();

  constructor({ idleTtlMs = 3_600_000, logger }: SessionStoreOptions = {}) {
    this.#idleTtlMs = idleTtlMs;
    this.#logger = logger;
    this.#reaper = setInterval(() => void this.reap(), Math.min(idleTtlMs, 60_000));
    this.#reaper.unref();
  }

  get size(): number {
    return this.#records.size;
  }

  #sign(id: string): string {
    return createHmac('sha256', this.#secret).update(id).digest('hex').slice(0, 32);
  }

  /** A new signed cookie value with a fresh session id. */
  newCookieValue(): string {
    const id = randomUUID();
    return `${id}.${this.#sign(id)}`;
  }

  /** The session id a cookie value carries, or undefined when it is absent or forged. */
  idFromCookie(value: string | undefined): string | undefined {
    if (!value) return undefined;
    const unquoted = value.length >= 2 && value.startsWith('"') && value.endsWith('"') ? value.slice(1, -1) : value;
    const dot = unquoted.lastIndexOf('.');
    if (dot <= 0) return undefined;
    const remembered = this.#verified.get(unquoted);
    if (remembered !== undefined) return remembered;
    const id = unquoted.slice(0, dot);
    const given = Buffer.from(unquoted.slice(dot + 1));
    const expected = Buffer.from(this.#sign(id));
    if (given.length !== expected.length || !timingSafeEqual(given, expected)) return undefined;
    // An HMAC per request was a tenth of a tool call's server time; forged values are never kept.
    if (this.#verified.size >= VERIFIED_CACHE_SIZE) this.#verified.delete(this.#verified.keys().next().value!);
    this.#verified.set(unquoted, id);
    return id;
  }

  /** The session with this id, created on first use. */
  get(id: string): Session {
    const existing = this.#records.get(id);
    if (existing) {
      existing.lastUsed = Date.now();
      return existing.session;
    }
    const closers: SessionRecord['closers'] = [];
    let ended = false;
    const session: Session = {
      id,
      state: {},
      onClose: (close) => {
        // A late resource (a tool that outlived its time limit) on an ended session: close it now.
        if (ended) void Promise.resolve().then(close).catch((error: unknown) => this.#logger?.warn({ err: error, session: id }, 'closing a late session resource failed'));
        else closers.push(close);
      },
    };
    this.#records.set(id, { session, closers, lastUsed: Date.now(), busy: 0 });
    this.#ended.set(session, () => (ended = true));
    return session;
  }

  has(id: string): boolean {
    return this.#records.has(id);
  }

  /** Ends a session: runs its closers in reverse order; errors are logged, never thrown. */
  async end(id: string): Promise<void> {
    const record = this.#records.get(id);
    if (!record) return;
    this.#records.delete(id);
    this.#ended.get(record.session)?.();
    await this.#close(id, record);
  }

  /** Marks a request for the session as started (true) or finished (false). */
  use(id: string, busy: boolean): void {
    const record = this.#records.get(id);
    if (!record) return;
    record.busy = Math.max(0, record.busy + (busy ? 1 : -1));
    record.lastUsed = Date.now();
  }

  /** Closes a session's resources (sandboxes, kernels) but keeps its state. */
  async releaseResources(id: string): Promise<void> {
    const record = this.#records.get(id);
    if (record) await this.#close(id, record);
  }

  async #close(id: string, record: SessionRecord): Promise<void> {
    const closers = record.closers.splice(0).reverse();
    for (const close of closers) {
      try {
        await close();
      } catch (error) {
        this.#logger?.warn({ err: error, session: id }, 'closing a session resource failed');
      }
    }
  }

  /** Ends every session idle for longer than the TTL. */
  async reap(now = Date.now()): Promise<number> {
    const stale = [...this.#records].filter(([, r]) => r.busy === 0 && now - r.lastUsed > this.#idleTtlMs).map(([id]) => id);
    await Promise.all(stale.map((id) => this.end(id)));
    return stale.length;
  }

  /** Ends every session and stops the reaper. */
  async close(): Promise<void> {
    clearInterval(this.#reaper);
    await Promise.all([...this.#records.keys()].map((id) => this.end(id)));
  }
}
