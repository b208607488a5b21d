import { RolloutError } from '../errors.ts';

/**
 * How a pause treats generations in flight: 'abort' cuts them (the HTTP request is aborted, which
 * aborts it in vLLM) and each is generated again from the same prompt once generation resumes;
 * 'finish' lets them end on the old weights. Either way the pause is answered once none is left.
 */
export type PauseMode = 'abort' | 'finish';

/** The weight state as the API shows it and the store keeps it. */
export interface WeightState {
  /** The greatest version announced so far (what staleness is measured against); null before any. */
  newest: number | null;
  /** The version every backend serves unless named below (the last announcement to all of them). */
  default: number | null;
  /** Versions announced for named backends, after the last announcement to all. */
  backends: Record<string, number>;
  /** Set while generation is paused for a weight update. */
  pause: { mode: PauseMode; since: string } | null;
}

export interface PauseOutcome {
  mode: PauseMode;
  /** Generations in flight when the pause began. */
  in_flight: number;
  /** Of those, how many were aborted (to be generated again after the resume). */
  aborted: number;
  /** How long the pause waited for generations in flight to end. */
  drained_ms: number;
}

/** Why a generation was aborted by a pause: it is generated again, never recorded. */
class PausedAbort extends Error {
  constructor() {
    super('generation aborted by a pause for a weight update');
  }
}

interface Flight {
  controller: AbortController;
  done: Promise<unknown>;
}

/**
 * The policy's weight versions and the pause gate of a weight update (asynchronous RL). The
 * trainer announces which integer version each backend serves; every turn records the version of
 * the backend it ran on. `pause` stops new generations (a rollout waits before its next turn,
 * its sandbox and tools alive) and aborts or lets finish those in flight; `resume` lets them go
 * on, on the version announced with it, or on the old one when the update failed.
 */
export class Weights {
  #newest: number | null = null;
  #default: number | null = null;
  readonly #backends = new Map<string, number>();
  #pause: { mode: PauseMode; since: string; started: number } | null = null;
  #resumed: Promise<void> = Promise.resolve();
  #wake: () => void = () => {};
  readonly #flights = new Set<Flight>();
  /** Pause time each rollout's turns spent waiting (left out of its time limit). */
  readonly #waited = new Map<string, number>();

  /** The version `backendId` serves now, null when none was announced. */
  versionOf(backendId: string | null | undefined): number | null {
    if (backendId !== null && backendId !== undefined) {
      const named = this.#backends.get(backendId);
      if (named !== undefined) return named;
    }
    return this.#default;
  }

  get newest(): number | null {
    return this.#newest;
  }

  get paused(): boolean {
    return this.#pause !== null;
  }

  /** Generations under way now. */
  get inFlight(): number {
    return this.#flights.size;
  }

  state(): WeightState {
    return {
      newest: this.#newest,
      default: this.#default,
      backends: Object.fromEntries(this.#backends),
      pause: this.#pause && { mode: this.#pause.mode, since: this.#pause.since },
    };
  }

  /** Takes a state the store kept (a restart during a pause stays paused). */
  restore(state: WeightState): void {
    this.#newest = state.newest;
    this.#default = state.default;
    this.#backends.clear();
    for (const [id, version] of Object.entries(state.backends)) this.#backends.set(id, version);
    if (state.pause && !this.#pause) this.#close(state.pause.mode, state.pause.since);
    else if (!state.pause && this.#pause) this.#open();
  }

  /** The trainer's word that `backends` (all of them when none are named) serve `version` now. */
  announce(version: number, backends?: readonly string[]): void {
    if (!Number.isInteger(version) || version < 0) throw new RolloutError({ code: 'BAD_REQUEST', message: `a weight version is an integer >= 0, not ${version}` });
    if (backends === undefined || backends.length === 0) {
      this.#default = version;
      this.#backends.clear();
    } else for (const id of backends) this.#backends.set(id, version);
    if (this.#newest === null || version > this.#newest) this.#newest = version;
  }

  /**
   * Pauses generation: no new generation starts until `resume`; those in flight are aborted or
   * left to finish (`mode`). Resolves once none is in flight. Pausing while paused changes the
   * mode (an 'abort' aborts what a 'finish' was waiting for).
   */
  async pause(mode: PauseMode): Promise<PauseOutcome> {
    const started = performance.now();
    if (!this.#pause) this.#close(mode, new Date().toISOString());
    else this.#pause.mode = mode;
    const flights = [...this.#flights];
    if (mode === 'abort') for (const flight of flights) flight.controller.abort(new PausedAbort());
    await Promise.allSettled(flights.map((flight) => flight.done));
    return { mode, in_flight: flights.length, aborted: mode === 'abort' ? flights.length : 0, drained_ms: performance.now() - started };
  }

  /** Lets generation go on; with a version, announced first (the update succeeded). */
  resume(version?: number, backends?: readonly string[]): void {
    if (version !== undefined) this.announce(version, backends);
    if (this.#pause) this.#open();
  }

  /** Pause time `rolloutId`'s turns have waited so far (a wait under way included). */
  pausedMs(rolloutId: string): number {
    const waited = this.#waited.get(rolloutId) ?? 0;
    return this.#pause && this.#waiting.has(rolloutId) ? waited + (performance.now() - this.#waiting.get(rolloutId)!) : waited;
  }

  /** Forgets a rollout's pause time (it has ended). */
  forget(rolloutId: string): void {
    this.#waited.delete(rolloutId);
  }

  readonly #waiting = new Map<string, number>();

  /**
   * One generation of `rolloutId` through the gate: waits while paused, runs `generate` with a
   * signal a pause in 'abort' mode aborts, and runs it again after the resume when it was. Its
   * result comes with the version of the backend it ran on (`backendOf` of the result) as of its
   * start, and the pause time it waited.
   */
  async generate<T>(
    rolloutId: string,
    signal: AbortSignal,
    generate: (signal: AbortSignal, started: (backendId: string) => void) => Promise<T>,
  ): Promise<{ value: T; version: number | null; pausedMs: number }> {
    let pausedMs = 0;
    for (;;) {
      while (this.#pause) {
        const since = performance.now();
        this.#waiting.set(rolloutId, since);
        try {
          await untilResumed(this.#resumed, signal);
        } finally {
          this.#waiting.delete(rolloutId);
          const waited = performance.now() - since;
          pausedMs += waited;
          this.#waited.set(rolloutId, (this.#waited.get(rolloutId) ?? 0) + waited);
        }
      }
      if (signal.aborted) throw signal.reason;
      const controller = new AbortController();
      const onAbort = () => controller.abort(signal.reason);
      signal.addEventListener('abort', onAbort, { once: true });
      let version: number | null = null;
      const running = generate(controller.signal, (backendId) => (version = this.versionOf(backendId)));
      const flight: Flight = { controller, done: running.catch(() => undefined) };
      this.#flights.add(flight);
      try {
        const value = await running;
        return { value, version, pausedMs };
      } catch (error) {
        // aborted by a pause, not by the rollout: generated again once generation resumes
        if (controller.signal.reason instanceof PausedAbort && !signal.aborted) continue;
        throw error;
      } finally {
        this.#flights.delete(flight);
        signal.removeEventListener('abort', onAbort);
      }
    }
  }

  #close(mode: PauseMode, since: string): void {
    this.#pause = { mode, since, started: performance.now() };
    this.#resumed = new Promise((resolve) => (this.#wake = resolve));
  }

  #open(): void {
    this.#pause = null;
    this.#wake();
  }
}

function untilResumed(resumed: Promise<void>, signal: AbortSignal): Promise<void> {
  if (signal.aborted) return Promise.reject(signal.reason);
  return new Promise((resolve, reject) => {
    const onAbort = () => reject(signal.reason);
    signal.addEventListener('abort', onAbort, { once: true });
    void resumed.then(() => {
      signal.removeEventListener('abort', onAbort);
      resolve();
    });
  });
}
