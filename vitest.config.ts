import { defaultServerConditions } from 'vite';
import { configDefaults, defineConfig } from 'vitest/config';
import SummaryReporter from './vitest.summary-reporter.ts';

// Tests and type checks run against TypeScript sources through the custom export condition.
const conditions = ['@rollserve/source', ...defaultServerConditions];

export default defineConfig({
  resolve: { conditions },
  ssr: { resolve: { conditions } },
  test: {
    reporters: ['default', new SummaryReporter()],
    // `pnpm test` runs one file per core (--maxWorkers=100%): vitest's default, one fewer, ran CI's
    // 2-core machine one file at a time, though most suites wait on their child processes, servers
    // and Slurm more than they compute. A bare `vitest run <files>` keeps the default. (Set on the
    // command line, not here: a value here is every project's, which --maxWorkers cannot override.)
    testTimeout: 30_000,
    // Servers log errors the tests provoke on purpose; ROLLSERVE_LOG_LEVEL=info shows them.
    // `rollserve start` warms up before it listens (seconds of CPU) only where a test asks for it.
    env: { ROLLSERVE_LOG_LEVEL: process.env.ROLLSERVE_LOG_LEVEL ?? 'silent', ROLLSERVE_WARM_UP: process.env.ROLLSERVE_WARM_UP ?? '0' },
    hookTimeout: 30_000,
    projects: [
      { extends: true, test: { name: 'core', include: ['packages/core/src/**/*.test.ts'] } },
      { extends: true, test: { name: 'testing', include: ['packages/testing/src/**/*.test.ts'] } },
      { extends: true, test: { name: 'environments', include: ['environments/*/src/**/*.test.ts'] } },
      { extends: true, test: { name: 'suites', include: ['test/**/*.test.ts'], exclude: [...configDefaults.exclude, 'test/sandbox/**'] } },
      // The sandbox suites one at a time, after the rest (one worker: vitest's sequential group).
      // Beside maker-death's endless sandbox starts and kills, bash-fork's forked shells and
      // images-cache's image use across processes failed; each passes alone.
      { extends: true, test: { name: 'sandbox', include: ['test/sandbox/**/*.test.ts'], maxWorkers: 1 } },
    ],
  },
});
