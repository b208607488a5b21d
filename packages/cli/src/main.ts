import { defineCommand, runMain, type CommandDef } from 'citty';
import { checkArgv, type CheckedCommand } from './argv-check.ts';
import { version } from './version.ts';

// Each command is loaded when it is run (or listed by --help), so `rollserve node` and
// `rollserve serve` load neither the rollout service, its store drivers nor its API docs.
const commands = {
  serve: () => import('./commands/serve.ts'),
  list: () => import('./commands/list.ts'),
  start: () => import('./commands/start.ts'),
  rollout: () => import('./commands/rollout.ts'),
  demo: () => import('./commands/demo.ts'),
  node: () => import('./commands/node.ts'),
  new: () => import('./commands/new.ts'),
  'gym-config': () => import('./commands/gym-config.ts'),
  'nemo-gym': () => import('./commands/nemo-gym.ts'),
} satisfies Record<string, () => Promise<{ default: CommandDef<any> }>>;
type Name = keyof typeof commands;

// A failure of the command is one line that says what went wrong (exit 1), never a stack trace;
// ROLLSERVE_DEBUG=1 shows the trace.
function reportingErrors(name: string, command: CommandDef<any>): CommandDef<any> {
  const run = command.run;
  if (run === undefined) return command;
  return {
    ...command,
    async run(context) {
      try {
        return await run(context);
      } catch (error) {
        if (process.env.ROLLSERVE_DEBUG === '1') console.error(error);
        const cause = (error as Error).cause instanceof Error ? ` (${((error as Error).cause as Error).message})` : '';
        console.error(`rollserve ${name}: ${error instanceof Error ? error.message : String(error)}${cause}`);
        process.exit(1);
      }
    },
  };
}

const loaded = new Map<Name, Promise<CommandDef<any>>>();
const load = (name: Name) => {
  let command = loaded.get(name);
  if (command === undefined) {
    command = commands[name]().then((module) => reportingErrors(name, module.default));
    loaded.set(name, command);
  }
  return command;
};

// A mistake on the command line is one line that says what was meant (exit 2); only the command
// named is loaded to check its options.
const argv = process.argv.slice(2);
const named = argv[0] !== undefined && Object.hasOwn(commands, argv[0]) ? (argv[0] as Name) : undefined;
const problem = checkArgv(argv, Object.keys(commands), named === undefined ? undefined : ((await load(named)) as CheckedCommand));
if (problem !== undefined) {
  console.error(`rollserve: ${problem}`);
  process.exit(2);
}

await runMain(
  defineCommand({
    meta: { name: 'rollserve', version, description: 'Rollout infrastructure for RL of LLM agents' },
    subCommands: Object.fromEntries(Object.keys(commands).map((name) => [name, () => load(name as Name)])),
  }),
);
