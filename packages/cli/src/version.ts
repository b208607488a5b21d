import { readFileSync } from 'node:fs';

/** This package's version (from src/ and dist/ alike: both are one folder below the package). */
export const version = (JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { version: string }).version;
