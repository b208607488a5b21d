import { existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pino from 'pino';
import { afterEach, describe, expect, it } from 'vitest';
import { bwrapAvailable, createBwrapProvider } from '../sandbox/bwrap/index.ts';
import { sandboxDirRoots } from '../sandbox/staging.ts';
import type { SandboxProvider } from '../sandbox/types.ts';
import { createSessionTools, type SessionTools } from '../tools/session-tools.ts';
import { bashTool, createBashTool, createEditorTool, createPythonTool, editorTool, pythonTool } from './builtin-tools.ts';
import type { EnvironmentContext, Session } from './context.ts';
import { toolOutputText } from './invoke-tool.ts';
import { toolDeclaration } from './tool.ts';

type TestSession = Session & { tools: SessionTools; close(): Promise<void> };

/** A session as the faces hand it out: state, onClose hooks and its tools, closed explicitly. */
function fakeSession(provider?: SandboxProvider): TestSession {
  const hooks: Array<() => Promise<void> | void> = [];
  const session: Session = { id: crypto.randomUUID(), state: {}, onClose: (fn) => hooks.push(fn) };
  const tools = createSessionTools(session, provider ? { provider } : {});
  return Object.assign(session, {
    tools,
    async close() {
      for (const hook of hooks.splice(0).reverse()) await hook();
    },
  });
}

const ctxOf = (session: TestSession): EnvironmentContext => ({
  session,
  config: {},
  logger: pino({ level: 'silent' }),
  signal: new AbortController().signal,
  tools: session.tools,
  resources: undefined,
});

describe('tool declarations', () => {
  it('offers JSON-Schema parameters from zod', () => {
    expect(toolDeclaration('bash', bashTool).parameters).toMatchObject({
      type: 'object',
      properties: { command: { type: 'string' }, timeout: { type: 'number' } },
      required: ['command'],
    });
    expect(toolDeclaration('execute_python', pythonTool).parameters).toMatchObject({ required: ['code'] });
    const editor = toolDeclaration('str_replace_editor', editorTool).parameters as { properties: Record<string, { enum?: string[] }> };
    expect(editor.properties.command?.enum).toEqual(['view', 'create', 'str_replace', 'insert', 'undo_edit']);
    expect(Object.keys(editor.properties)).toEqual(['command', 'path', 'file_text', 'old_str', 'new_str', 'insert_line', 'view_range']);
  });
});

const skip = bwrapAvailable() ? undefined : 'bwrap is not installed';
if (skip) console.warn(`[tool definition tests] skipped: ${skip}`);

describe.skipIf(skip !== undefined)('ready-made tools on a session', () => {
  const provider = createBwrapProvider();
  const bash = createBashTool();
  const python = createPythonTool({ defaultTimeoutMs: 500 });
  const editor = createEditorTool();
  const sessions: TestSession[] = [];
  const open = () => {
    const session = fakeSession(provider);
    sessions.push(session);
    return session;
  };
  afterEach(async () => {
    await Promise.all(sessions.splice(0).map((s) => s.close()));
  });

  it('share one sandbox per session across bash, python and the editor', async () => {
    const session = open();
    const ctx = ctxOf(session);
    expect(await bash.handler({ command: 'cd /workspace && echo hi > a.txt && cat a.txt' }, ctx)).toEqual({ output: 'hi\n', exitCode: 0, timedOut: false });
    const failed = await bash.handler({ command: 'false' }, ctx);
    expect(failed).toEqual({ output: '', exitCode: 1, timedOut: false });
    // what the model reads, as before the result was structured
    expect(toolOutputText(failed, bash)).toBe('\n[exit code: 1]');
    expect(bash.execution!(failed)).toEqual({ exitCode: 1, timedOut: false, exception: null });
    expect(await python.handler({ code: 'open("/workspace/a.txt").read()' }, ctx)).toMatchObject({ status: 'ok', result: "'hi\\n'" });
    expect(await editor.handler({ command: 'str_replace', path: '/workspace/a.txt', old_str: 'hi', new_str: 'bye' }, ctx)).toContain(
      'has been edited',
    );
    expect(toolOutputText(await bash.handler({ command: 'cat /workspace/a.txt' }, ctx), bash)).toBe('bye\n');
    const timedOut = (await python.handler({ code: 'import time; time.sleep(5)' }, ctx)) as { status: string; error: string };
    expect(timedOut.status).toBe('timeout');
    expect(timedOut.error).toContain('KeyboardInterrupt');
    expect(python.execution!(timedOut)).toMatchObject({ timedOut: true, exitCode: null });
    const raised = await python.handler({ code: 'raise ValueError("bad")' }, ctx);
    expect(python.execution!(raised)).toEqual({ exitCode: null, timedOut: false, exception: 'ValueError: bad' });
    const slow = await bash.handler({ command: 'sleep 5', timeout: 0.2 }, ctx);
    expect(slow).toMatchObject({ exitCode: null, timedOut: true });
    expect(toolOutputText(slow, bash)).toContain('timed out after 0.2 seconds');
    expect(bash.execution!(slow)).toEqual({ exitCode: null, timedOut: true, exception: null });
  });

  it('isolates sessions and closes everything with the session', async () => {
    const a = open();
    const b = open();
    await bash.handler({ command: 'echo secret > /workspace/mine' }, ctxOf(a));
    expect(await bash.handler({ command: 'ls /workspace' }, ctxOf(b))).toMatchObject({ output: '' });
    const sandbox = await a.tools.sandbox();
    const dir = sandboxDirRoots().map((root) => join(root, `rollserve-${sandbox.id}`)).find((path) => existsSync(path)) ?? join(tmpdir(), `rollserve-${sandbox.id}`);
    expect(existsSync(dir)).toBe(true);
    await a.close();
    expect(await sandbox.status()).toBe('stopped');
    expect(existsSync(dir)).toBe(false);
    // a call on a closed session's tools fails plainly rather than reusing closed resources
    await expect(bash.handler({ command: 'ls /workspace' }, ctxOf(a))).rejects.toThrow('session tools are closed');
  });

  it('creates each resource once when calls race', async () => {
    const session = open();
    const ctx = ctxOf(session);
    const outputs = await Promise.all(Array.from({ length: 5 }, (_, i) => bash.handler({ command: `echo ${i}` }, ctx)));
    expect(outputs.map((o) => (o as { output: string }).output)).toEqual(['0\n', '1\n', '2\n', '3\n', '4\n']);
    expect(await session.tools.sandbox()).toBe(await session.tools.sandbox());
  });
});
