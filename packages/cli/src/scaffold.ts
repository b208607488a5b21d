import { existsSync, readFileSync } from 'node:fs';
import { mkdir, readFile, symlink, writeFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { dirname, join, relative, resolve } from 'node:path';
import { stringify } from 'yaml';
import { RolloutError } from '@rollserve/core';
import { findWorkspaceRoot } from './discover.ts';

// the @rollserve/core this CLI runs with: the package a new environment depends on
const coreDir = dirname(createRequire(import.meta.url).resolve('@rollserve/core/package.json'));

export interface ScaffoldOptions {
  /** The environment name: the package is `@rollserve/env-<name>`. */
  name: string;
  /**
   * The directory to create. Default: `environments/<name>` of the workspace this command runs
   * in; elsewhere the package depends on this rollserve checkout through `link:`.
   */
  dir?: string;
}

export interface ScaffoldResult {
  dir: string;
  /** Whether it was made inside a rollserve workspace (workspace:* dependencies). */
  inWorkspace: boolean;
  files: string[];
}

const pascal = (name: string) => name.replace(/(^|-)([a-z0-9])/g, (_m, _d, c: string) => c.toUpperCase());

function versions(): Record<string, string> {
  const root = findWorkspaceRoot(coreDir);
  const rootPkg = root ? (JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { devDependencies?: Record<string, string> }) : {};
  const corePkg = JSON.parse(readFileSync(join(coreDir, 'package.json'), 'utf8')) as { dependencies: Record<string, string> };
  return {
    zod: corePkg.dependencies.zod ?? 'latest',
    vitest: rootPkg.devDependencies?.vitest ?? 'latest',
    typescript: rootPkg.devDependencies?.typescript ?? 'latest',
    '@types/node': rootPkg.devDependencies?.['@types/node'] ?? 'latest',
  };
}

const INDEX = (name: string) => `import { defineEnvironment, defineTool, outputText } from '@rollserve/core';
import { z } from 'zod';

/** The last whole number in a text, or null. */
export function lastNumber(text: string): number | null {
  const found = text.match(/-?\\d+/g);
  return found ? Number(found.at(-1)) : null;
}

/**
 * ${pascal(name)}: the model counts the words of a text, with a tool to help it, and is scored on
 * the count it gives last. Replace the row, the tool and verify with your task's.
 */
export default defineEnvironment({
  name: '${name}',
  domain: 'other',
  description: 'Count the words of a text (rollserve example environment)',
  row: z.object({ text: z.string(), expected_count: z.number().int() }),
  tools: {
    count_words: defineTool({
      description: 'Count the whitespace-separated words of a text',
      parameters: z.object({ text: z.string() }),
      handler: ({ text }) => ({ count: text.split(/\\s+/).filter(Boolean).length }),
    }),
  },
  verify(row, response) {
    const answer = lastNumber(outputText(response));
    return {
      reward: answer === row.expected_count ? 1 : 0,
      expected_count: row.expected_count,
      extracted_answer: answer,
    };
  },
  reverifyMode: 'stateless',
});
`;

const TEST = (name: string) => `import { describeContract } from '@rollserve/testing';
import { describe, expect, it } from 'vitest';
import env, { lastNumber } from './index.ts';

const row = {
  responses_create_params: { input: [{ role: 'user', content: 'How many words: "a b c"?' }] },
  text: 'a b c',
  expected_count: 3,
};
const answer = (text: string) => ({ output: [{ type: 'message', role: 'assistant', content: [{ type: 'output_text', text }] }] });

describe('${name}', () => {
  it('scores the last number of the answer', async () => {
    const ctx = {} as never;
    expect((await env.verify(row, answer('There are 3 words.'), ctx)).reward).toBe(1);
    expect((await env.verify(row, answer('Maybe 3, no: 4.'), ctx)).reward).toBe(0);
    expect((await env.verify(row, answer('no idea'), ctx)).extracted_answer).toBeNull();
  });

  it('counts words with its tool', async () => {
    expect(await env.tools.count_words!.handler({ text: ' one  two\\nthree ' }, {} as never)).toEqual({ count: 3 });
    expect(lastNumber('x -2 and 10')).toBe(10);
  });
});

// The NeMo Gym resources-server contract, over real HTTP.
describeContract({ env, extraKeys: ['expected_count', 'extracted_answer'], sampleRow: row });
`;

function exampleRows(): string {
  const texts = ['the quick brown fox', 'hello world', 'a b c d e f g', 'rollouts for reinforcement learning', 'one'];
  const tool = {
    type: 'function',
    name: 'count_words',
    description: 'Count the whitespace-separated words of a text',
    parameters: { type: 'object', properties: { text: { type: 'string' } }, required: ['text'], additionalProperties: false },
    strict: true,
  };
  return texts
    .map((text) =>
      JSON.stringify({
        responses_create_params: { input: [{ role: 'user', content: `How many words are in "${text}"? End with the number.` }], tools: [tool] },
        text,
        expected_count: text.split(/\s+/).length,
      }),
    )
    .join('\n')
    .concat('\n');
}

/** Creates a new environment package that builds, passes its tests and serves at once. */
export async function scaffoldEnvironment(options: ScaffoldOptions): Promise<ScaffoldResult> {
  const { name } = options;
  if (!/^[a-z][a-z0-9-]*$/.test(name)) {
    throw new RolloutError({ code: 'BAD_REQUEST', message: `environment names are lower-case letters, digits and dashes, starting with a letter (got "${name}")` });
  }
  const workspace = findWorkspaceRoot(process.cwd());
  const dir = resolve(options.dir ?? (workspace ? join(workspace, 'environments', name) : name));
  if (existsSync(dir)) throw new RolloutError({ code: 'CONFLICT', message: `${dir} exists already` });
  const inWorkspace = workspace !== undefined && resolve(dir, '..') === join(workspace, 'environments');
  const testingDir = resolve(coreDir, '..', 'testing');
  const v = versions();
  const dep = (path: string) => (inWorkspace ? 'workspace:*' : `link:${relative(dir, path)}`);

  const pkg = {
    name: `@rollserve/env-${name}`,
    version: '0.1.0',
    description: `${pascal(name)}: a rollserve environment (NeMo Gym resources server)`,
    type: 'module',
    exports: {
      '.': { '@rollserve/source': './src/index.ts', types: './dist/index.d.ts', default: './dist/index.js' },
      './package.json': './package.json',
    },
    scripts: { build: 'tsc -b', typecheck: 'tsc -b', test: 'vitest run' },
    dependencies: { '@rollserve/core': dep(coreDir), zod: v.zod },
    devDependencies: {
      '@rollserve/testing': dep(testingDir),
      '@types/node': v['@types/node'],
      ...(inWorkspace ? {} : { typescript: v.typescript, vitest: v.vitest }),
    },
  };
  const tsconfig = inWorkspace
    ? {
        extends: '../../tsconfig.base.json',
        compilerOptions: { rootDir: 'src', outDir: 'dist' },
        include: ['src'],
        exclude: ['src/**/*.test.ts'],
        references: [{ path: '../../packages/core' }],
      }
    : {
        compilerOptions: {
          target: 'ES2023',
          lib: ['ES2023'],
          module: 'nodenext',
          moduleResolution: 'nodenext',
          strict: true,
          noUncheckedIndexedAccess: true,
          exactOptionalPropertyTypes: true,
          verbatimModuleSyntax: true,
          rewriteRelativeImportExtensions: true,
          allowImportingTsExtensions: true,
          skipLibCheck: true,
          declaration: true,
          rootDir: 'src',
          outDir: 'dist',
          types: ['node'],
        },
        include: ['src'],
        exclude: ['src/**/*.test.ts'],
      };
  const gymConfig = {
    [name]: { resources_servers: { [name]: { entrypoint: 'app.py', domain: 'other', verified: false, description: `${pascal(name)} (rollserve)` } } },
    [`${name}_simple_agent`]: {
      responses_api_agents: {
        simple_agent: {
          entrypoint: 'app.py',
          resources_server: { type: 'resources_servers', name },
          model_server: { type: 'responses_api_models', name: 'policy_model' },
          datasets: [{ name: 'example', type: 'example', jsonl_fpath: `resources_servers/${name}/data/example.jsonl` }],
        },
      },
    },
  };
  const files: Record<string, string> = {
    'package.json': `${JSON.stringify(pkg, null, 2)}\n`,
    'tsconfig.json': `${JSON.stringify(tsconfig, null, 2)}\n`,
    'src/index.ts': INDEX(name),
    'src/index.test.ts': TEST(name),
    'data/example.jsonl': exampleRows(),
    'nemo-gym/requirements.txt': '# rollserve environments are Node programs; app.py only execs node.\n',
    [`nemo-gym/configs/${name}.yaml`]: `# ${name}: registered with NeMo Gym through its app.py shim.\n${stringify(gymConfig)}`,
    'README.md': `# @rollserve/env-${name}

${pascal(name)}: a rollserve environment, served as a NeMo Gym resources server.

## Use

\`\`\`sh
pnpm install && pnpm build                 # from the rollserve workspace
node packages/cli/bin/rollserve.js serve ${name}    # standalone, prints its URL
pnpm exec vitest run environments/${name}  # its tests (the NeMo Gym contract suite included)
\`\`\`

Register with NeMo Gym: \`NEMO_GYM_EXTRA_ROOTS=<rollserve>/nemo-gym gym env start --config resources_servers/${name}/configs/${name}.yaml --config <model config>\`.

## Row fields

- \`text\`: the text to count; \`expected_count\`: the answer.

Verify extras: \`expected_count\`, \`extracted_answer\` (the last whole number of the answer, or null).
`,
  };
  for (const [file, text] of Object.entries(files)) {
    await mkdir(dirname(join(dir, file)), { recursive: true });
    await writeFile(join(dir, file), text);
  }
  const shim = join(coreDir, 'nemo-gym', 'app.py');
  if (inWorkspace) {
    await symlink(relative(join(dir, 'nemo-gym'), shim), join(dir, 'nemo-gym', 'app.py'));
    await symlink('../data', join(dir, 'nemo-gym', 'data'));
    // Register it with the workspace: the build graph and the NeMo Gym search root.
    const rootTsconfig = join(workspace!, 'tsconfig.json');
    const refs = JSON.parse(await readFile(rootTsconfig, 'utf8')) as { references: Array<{ path: string }> };
    refs.references.push({ path: `environments/${name}` });
    await writeFile(rootTsconfig, `${JSON.stringify(refs, null, 2)}\n`);
    const link = join(workspace!, 'nemo-gym', 'resources_servers', name);
    if (!existsSync(link)) await symlink(`../../environments/${name}/nemo-gym`, link);
  } else {
    await writeFile(join(dir, 'nemo-gym', 'app.py'), await readFile(shim, 'utf8'));
    await symlink('../data', join(dir, 'nemo-gym', 'data'));
  }
  return { dir, inWorkspace, files: [...Object.keys(files), 'nemo-gym/app.py', 'nemo-gym/data'] };
}
