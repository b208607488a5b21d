import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { RolloutError } from '../errors.ts';
import type { Environment } from './environment.ts';

function isEnvironment(value: unknown): value is Environment {
  return typeof value === 'object' && value !== null && typeof (value as Environment).name === 'string' && typeof (value as Environment).verify === 'function';
}

/** Imports an environment package's default export (its built `dist`, or its source under tsx). */
export async function loadEnvironment(dir: string): Promise<Environment> {
  const pkg = JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8')) as {
    name: string;
    exports?: { '.': Record<string, string> };
  };
  const entries = pkg.exports?.['.'] ?? {};
  const fromSource = process.execArgv.some((arg) => arg.includes('@rollserve/source'));
  const target = (fromSource ? entries['@rollserve/source'] : undefined) ?? entries.default ?? './dist/index.js';
  const file = join(dir, target);
  if (!existsSync(file)) {
    throw new RolloutError({ code: 'NOT_FOUND', message: `${pkg.name} is not built (${file} is missing): run \`pnpm build\`` });
  }
  const module = (await import(pathToFileURL(file).href)) as { default?: unknown };
  if (!isEnvironment(module.default)) {
    throw new RolloutError({ code: 'BAD_REQUEST', message: `${pkg.name} does not default-export an environment (defineEnvironment)` });
  }
  return module.default;
}
