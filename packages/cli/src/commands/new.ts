import { defineCommand } from 'citty';
import { scaffoldEnvironment } from '../scaffold.ts';

export default defineCommand({
  meta: { name: 'new', description: 'Create an environment package that builds, passes its tests and serves at once' },
  args: {
    name: { type: 'positional', description: 'Environment name (lower-case letters, digits, dashes)', required: true },
    dir: { type: 'string', description: 'Where to create it (default: environments/<name> of this workspace)' },
  },
  async run({ args }) {
    const result = await scaffoldEnvironment({ name: args.name, ...(args.dir ? { dir: args.dir } : {}) });
    console.log(`created ${result.dir}`);
    console.log(result.inWorkspace ? `next: pnpm install && pnpm build && pnpm exec vitest run environments/${args.name}` : `next: cd ${result.dir} && pnpm install && pnpm build && pnpm test`);
  },
});
