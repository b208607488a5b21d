import { defineCommand } from 'citty';
import { listInstalledEnvironments } from '../discover.ts';

export default defineCommand({
  meta: { name: 'list', description: 'Show the installed environments' },
  run() {
    const installed = listInstalledEnvironments();
    if (installed.length === 0) console.log('no environments installed');
    for (const env of installed) console.log(`${env.name.padEnd(12)} ${env.packageName.padEnd(24)} ${env.description ?? ''}`);
  },
});
