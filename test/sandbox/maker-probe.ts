// A sandbox maker for maker-death.test.ts, run as its own Node process (`tsx maker-probe.ts
// <tmpDir> <plain|kernels|image> [<image> <image cache>]`): it starts bwrap sandboxes in <tmpDir>
// without end, several at a time, each running a command and a background process (and a Python
// kernel entering it, or on the image), and closes none, so that whenever it is SIGKILLed some
// sandbox is starting, some command running, some kernel starting. It prints "made <id>" per
// sandbox running.
import { createBwrapProvider, type Sandbox } from '../../packages/core/src/sandbox/index.ts';
import { PythonKernel } from '../../packages/core/src/tools/index.ts';

const [tmpDir, mode, image, imageCacheDir] = process.argv.slice(2);
const provider = createBwrapProvider({ tmpDir: tmpDir!, ...(imageCacheDir === undefined ? {} : { imageCacheDir }) });
const AT_ONCE = 3;
/** Sandboxes it makes at most (it is killed long before, as a rule). */
const MOST = 40;
let made = 0;

async function one(): Promise<void> {
  const sandbox: Sandbox = await provider.create(mode === 'image' ? { image: image! } : {});
  process.stdout.write(`made ${sandbox.id}\n`);
  // a process left in the background, as a tool call may leave one, and one running
  await sandbox.exec('sleep 1000 >/dev/null 2>&1 &');
  void sandbox.exec('sleep 1000');
  if (mode === 'kernels') {
    const kernel = await PythonKernel.start(sandbox);
    await kernel.run('x = 1');
  }
}

for (let i = 0; i < AT_ONCE; i++) {
  void (async () => {
    while (made++ < MOST) {
      try {
        await one();
      } catch (error) {
        process.stderr.write(`${(error as Error).message}\n`);
      }
    }
  })();
}
