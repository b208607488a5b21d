import { suggest } from '@rollserve/core';

/** What argv-check needs of a citty command: its argument definitions. */
export interface CheckedCommand {
  args?: Record<string, { type?: string; alias?: string | string[]; required?: boolean; description?: string }>;
}

/**
 * Checks a command line before citty runs it: an unknown command or option is an error that says
 * what was meant, not a default silently used nor a stack trace. Returns the message, or undefined
 * when the line is well-formed. (citty itself accepts any `--flag`.) `names` are the commands;
 * `command` is the one the line names, loaded (undefined when it names none of them).
 */
export function checkArgv(argv: readonly string[], names: readonly string[], command: CheckedCommand | undefined): string | undefined {
  const [name, ...rest] = argv;
  if (name === undefined || name.startsWith('-')) return undefined; // --help, --version
  if (command === undefined) {
    const hint = suggest(name, names);
    return `unknown command "${name}"${hint === undefined ? '' : `; did you mean "${hint}"?`} (rollserve --help lists the commands)`;
  }
  const args = command.args ?? {};
  const flags = new Map<string, string>();
  for (const [key, def] of Object.entries(args)) {
    if (def.type === 'positional') continue;
    flags.set(key, def.type ?? 'string');
    for (const alias of [def.alias ?? []].flat()) flags.set(alias, def.type ?? 'string');
    if (def.type === 'boolean') flags.set(`no-${key}`, 'boolean');
  }
  flags.set('help', 'boolean');
  flags.set('h', 'boolean');
  const given = new Set<string>();
  for (let i = 0; i < rest.length; i++) {
    const token = rest[i]!;
    if (token === '--') break;
    if (!token.startsWith('-') || token === '-') continue;
    const [flag, inline] = token.replace(/^--?/, '').split(/=(.*)/s) as [string, string | undefined];
    const type = flags.get(flag);
    given.add(flag);
    if (type === undefined) {
      const hint = suggest(flag, [...flags.keys()].filter((key) => key !== 'h'));
      return `unknown option ${token.split('=')[0]} for "rollserve ${name}"${hint === undefined ? '' : `; did you mean --${hint}?`} (rollserve ${name} --help lists its options)`;
    }
    if (type === 'string' && inline === undefined) {
      const next = rest[i + 1];
      // `--policy --model m`: the next option is not the value (an unquoted empty variable, say)
      const nextIsOption = next !== undefined && next.startsWith('--') && flags.has(next.slice(2).split('=')[0]!);
      if (next === undefined || nextIsOption) return `option --${flag} of "rollserve ${name}" needs a value`;
      i++;
    }
  }
  if (given.has('help') || given.has('h')) return undefined;
  // citty would print its usage and then the error; one line naming the flag reads better
  for (const [key, def] of Object.entries(args)) {
    if (def.type === 'positional' || def.required !== true || given.has(key)) continue;
    if ([def.alias ?? []].flat().some((alias) => given.has(alias))) continue;
    return `option --${key} of "rollserve ${name}" is required${def.description ? ` (${def.description})` : ''}`;
  }
  return undefined;
}
