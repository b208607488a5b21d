import { RolloutError } from '../errors.ts';

/**
 * A store's driver, imported when a store of its kind is opened, not when core is: the drivers are
 * optional peer dependencies of @rollserve/core (@rollserve/cli installs both), so an environment's
 * install, a rollout node and a resources server do without them.
 */
export async function importDriver<T>(name: 'better-sqlite3' | 'pg', load: () => Promise<T>): Promise<T> {
  try {
    return await load();
  } catch (error) {
    const code = (error as { code?: string }).code;
    if (code !== 'ERR_MODULE_NOT_FOUND' && code !== 'MODULE_NOT_FOUND') throw error;
    throw new RolloutError({ code: 'UNAVAILABLE', message: `this store needs the ${name} package: install it beside @rollserve/core (@rollserve/cli depends on it)`, cause: error });
  }
}
