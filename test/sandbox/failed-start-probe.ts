// A service for failed-start.test.ts, run as pid 1 of a pid namespace of its own (as a service is
// in a container without an init), where every orphan comes to it and is never reaped: `tsx
// failed-start-probe.ts <tmpDir> <fake bwrap>`. Its sandbox's bwrap (the fake: a sleep that never
// says it runs) times out; it then prints, as JSON, whether the fake ran, what of it is left, and
// which processes of its namespace are zombies.
import { readdirSync, readFileSync } from 'node:fs';
import { createBwrapProvider } from '../../packages/core/src/sandbox/index.ts';

const [tmpDir, fake] = process.argv.slice(2);

function processes(): Array<{ pid: number; state: string; ppid: number; cmdline: string }> {
  const list = [];
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const status = readFileSync(`/proc/${name}/status`, 'latin1');
      list.push({
        pid: Number(name),
        state: /^State:\s*(\S)/m.exec(status)?.[1] ?? '?',
        ppid: Number(/^PPid:\s*(\d+)/m.exec(status)?.[1]),
        cmdline: readFileSync(`/proc/${name}/cmdline`, 'latin1').replaceAll('\0', ' ').trim(),
      });
    } catch {
      // ended
    }
  }
  return list;
}

const provider = createBwrapProvider({ tmpDir: tmpDir!, bwrapPath: fake!, readyTimeoutMs: 1500 });
const seen = new Set<number>();
const watch = setInterval(() => {
  for (const p of processes()) if (p.cmdline.startsWith('sleep 1001')) seen.add(p.pid);
}, 20);
let error = '';
try {
  await provider.create();
} catch (caught) {
  error = (caught as Error).message;
}
clearInterval(watch);
// what is left of the start, once whatever was killed has been reaped (or is a zombie for good)
let zombies: string[] = [];
let left: number[] = [];
for (let i = 0; i < 100; i++) {
  const now = processes();
  zombies = now.filter((p) => p.state === 'Z').map((p) => `${p.pid} (ppid ${p.ppid})`);
  left = [...seen].filter((pid) => now.some((p) => p.pid === pid));
  if (zombies.length === 0 && left.length === 0) break;
  await new Promise((resolve) => setTimeout(resolve, 50));
}
await provider.close?.();
process.stdout.write(`${JSON.stringify({ error, ran: seen.size, zombies, left })}\n`);
process.exit(0);
