import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';

/** The scripted policy in a process of its own (as a real inference server is); resolves with its URL. */
export async function startPolicyProcess(options: Record<string, unknown>): Promise<{ url: string; child: ChildProcess }> {
  const script = fileURLToPath(new URL('./fake-policy-process.ts', import.meta.url));
  const child = spawn(process.execPath, ['--import', 'tsx', '--conditions=@rollserve/source', script, JSON.stringify(options)], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const url = await new Promise<string>((resolve, reject) => {
    child.stdout!.once('data', (chunk: Buffer) => resolve(chunk.toString().trim()));
    child.once('exit', (code) => reject(new Error(`fake policy exited with ${code}`)));
  });
  return { url, child };
}
