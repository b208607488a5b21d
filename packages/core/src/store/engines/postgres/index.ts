import type { StoreEngine } from '../../dialect.ts';

/** PostgreSQL through pg's pool: the store a cluster of rollout nodes shares. */
export const postgresEngine: StoreEngine = {
  name: 'postgres',
  accepts: (url) => url.startsWith('postgres://') || url.startsWith('postgresql://'),
  forms: ['postgres://…'],
  async open(url, options) {
    const { PostgresDialect } = await import('./dialect.ts');
    return PostgresDialect.open(url, options);
  },
};
