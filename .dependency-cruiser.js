// The import rules CI holds the code to (`pnpm cycles`, part of `pnpm test`): no import cycle,
// type-only imports included, and the layers of README.md's "Layers" paragraph. Tests are left out:
// a test may import what it checks from any layer.

/**
 * The folders of packages/core/src, each with the layers it stands on directly. A layer may import
 * what it stands on and, through it, what that stands on; nothing else of core (index.ts and
 * exports/, the package's doors, are imported by no one inside core). Two layers neither of which stands on the
 * other (gym/ and store/, say) never import each other.
 */
const coreLayers = {
  'errors.ts': [],
  protocol: ['errors.ts'],
  sandbox: ['errors.ts'],
  tools: ['sandbox'],
  spec: ['protocol', 'tools'],
  server: ['spec'],
  gym: ['server'],
  llm: ['protocol', 'errors.ts'],
  runner: ['server', 'llm'],
  store: ['protocol'],
  slurm: ['protocol'],
  service: ['runner', 'store', 'slurm'],
  api: ['service', 'gym'],
  node: ['runner', 'slurm'],
};

/** The package's doors (package.json "exports"), the only files of core other packages import; `./internal` is for tests. */
const publicDoors = '^packages/core/src/(index\\.ts|exports/(sandbox|gym|node|service)\\.ts)$';

/**
 * Imports that break the layers today, each kept until the change named beside it ends it; any
 * other import across the layers fails. None are left.
 */
const knownBreaches = {};

const below = (layer) => [...new Set(coreLayers[layer].flatMap((lower) => [lower, ...below(lower)]))];
const corePath = (layer) => `^packages/core/src/${layer.endsWith('.ts') ? `${layer.replace('.', '\\.')}$` : `${layer}/`}`;

const layerRules = Object.keys(coreLayers).map((layer) => ({
  name: `layer-${layer.replace('.ts', '')}`,
  comment: `${layer} imports only the layers it stands on: ${below(layer).join(', ') || 'none'}`,
  severity: 'error',
  from: { path: corePath(layer) },
  to: { path: '^packages/core/src/', pathNot: [...[layer, ...below(layer)].map(corePath), ...(knownBreaches[layer] ?? [])] },
}));

/** @type {import('dependency-cruiser').IConfiguration} */
export default {
  forbidden: [
    {
      name: 'no-circular',
      comment: 'files that import each other, directly or round a loop (type-only imports count)',
      severity: 'error',
      from: {},
      to: { circular: true },
    },
    ...layerRules,
    {
      name: 'core-imports-no-package-above',
      comment: 'core never imports an environment, @rollserve/testing or the cross-package suites',
      severity: 'error',
      from: { path: '^packages/core/' },
      to: { path: '^(environments/|packages/(?!core/)|test/)' },
    },
    {
      name: 'environment-through-core-entry',
      comment: "an environment imports its own files and @rollserve/core's public doors, never core's internals or another package",
      severity: 'error',
      from: { path: '^environments/([^/]+)/' },
      to: { path: '^(environments|packages|test)/', pathNot: ['^environments/$1/', publicDoors] },
    },
    {
      name: 'testing-through-core-entry',
      comment: "@rollserve/testing imports its own files and @rollserve/core's public doors only",
      severity: 'error',
      from: { path: '^packages/testing/' },
      to: { path: '^(environments|packages|test)/', pathNot: ['^packages/testing/', publicDoors] },
    },
    {
      name: 'cli-through-core-entry',
      comment: "@rollserve/cli imports its own files and @rollserve/core's public doors only",
      severity: 'error',
      from: { path: '^packages/cli/' },
      to: { path: '^(environments|packages|test)/', pathNot: ['^packages/cli/', publicDoors] },
    },
    {
      name: 'slim-doors',
      comment: "core's \".\", ./sandbox, ./gym and ./node load neither the service nor its store and API (nor so their drivers and swagger): an environment server and a rollout node import only these",
      severity: 'error',
      from: { path: '^packages/core/src/(index\\.ts|exports/(sandbox|gym|node)\\.ts)$' },
      to: { path: '^packages/core/src/(service|store|api)/', reachable: true },
    },
  ],
  options: {
    doNotFollow: { path: 'node_modules' },
    exclude: { path: ['\\.test\\.ts$', '/dist/'] },
    // type-only imports are dependencies too: a cycle of types still ties the files together
    tsPreCompilationDeps: true,
    // resolve @rollserve/* to their sources, as tsc and vitest do (the @rollserve/source condition)
    enhancedResolveOptions: {
      exportsFields: ['exports'],
      conditionNames: ['@rollserve/source', 'import', 'types', 'default'],
      extensions: ['.ts', '.js', '.mjs', '.json'],
    },
  },
};
