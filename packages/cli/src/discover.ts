import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { RolloutError } from '@rollserve/core';

/** An environment package found on this machine. */
export interface InstalledEnvironment {
  /** The environment name: the package `@rollserve/env-<name>`. */
  name: string;
  packageName: string;
  /** The package directory. */
  dir: string;
  description?: string;
}

const ENV_PACKAGE = /^@rollserve\/env-([a-z][a-z0-9_-]*)$/;

/** The monorepo root above `from` (the directory holding pnpm-workspace.yaml), if any. */
export function findWorkspaceRoot(from: string): string | undefined {
  let dir = resolve(from);
  for (;;) {
    if (existsSync(join(dir, 'pnpm-workspace.yaml'))) return dir;
    const parent = dirname(dir);
    if (parent === dir) return undefined;
    dir = parent;
  }
}

function readPackage(dir: string): InstalledEnvironment | undefined {
  const file = join(dir, 'package.json');
  if (!existsSync(file)) return undefined;
  const pkg = JSON.parse(readFileSync(file, 'utf8')) as { name?: string; description?: string };
  const match = ENV_PACKAGE.exec(pkg.name ?? '');
  if (!match) return undefined;
  return { name: match[1]!, packageName: pkg.name!, dir, ...(pkg.description ? { description: pkg.description } : {}) };
}

function packagesUnder(dir: string): string[] {
  if (!existsSync(dir)) return [];
  return readdirSync(dir, { withFileTypes: true })
    .filter((entry) => entry.isDirectory() || entry.isSymbolicLink())
    .map((entry) => join(dir, entry.name));
}

/**
 * Environment packages, found in: `ROLLSERVE_ENVIRONMENTS` (colon-separated package directories or
 * directories of packages), the workspace's `environments/`, and `node_modules/@rollserve/` of the
 * current directory. The first one found of a name wins.
 */
export function listInstalledEnvironments(cwd = process.cwd()): InstalledEnvironment[] {
  const candidates: string[] = [];
  for (const entry of (process.env.ROLLSERVE_ENVIRONMENTS ?? '').split(':').filter(Boolean)) {
    candidates.push(entry, ...packagesUnder(entry));
  }
  const here = dirname(fileURLToPath(import.meta.url));
  for (const root of new Set([findWorkspaceRoot(cwd), findWorkspaceRoot(here)])) {
    if (root) candidates.push(...packagesUnder(join(root, 'environments')));
  }
  candidates.push(...packagesUnder(join(cwd, 'node_modules', '@rollserve')));
  const found = new Map<string, InstalledEnvironment>();
  for (const dir of candidates) {
    const env = readPackage(dir);
    if (env && !found.has(env.name)) found.set(env.name, env);
  }
  return [...found.values()].sort((a, b) => a.name.localeCompare(b.name));
}

/** Finds installed environments by name; an unknown name is an error that lists the known ones. */
export function resolveEnvironments(names: readonly string[], cwd = process.cwd()): InstalledEnvironment[] {
  const installed = listInstalledEnvironments(cwd);
  return names.map((name) => {
    const found = installed.find((env) => env.name === name);
    if (!found) {
      const known = installed.map((env) => env.name).join(', ') || 'none';
      throw new RolloutError({ code: 'NOT_FOUND', message: `no environment "${name}" is installed (installed: ${known})` });
    }
    return found;
  });
}
