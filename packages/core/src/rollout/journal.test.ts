import fs from 'node:fs';
import { mkdtemp, open, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { Journal } from './journal.ts';
import { RolloutTask } from './types.ts';

const dirs: string[] = [];
afterEach(async () => {
  await Promise.all(dirs.splice(0).map((d) => rm(d, { recursive: true, force: true })));
});

const task = (id: string) =>
  RolloutTask.parse({ id, env: 'math', row: { responses_create_params: { input: 'x' } }, policy: { model: 'm' } });

async function tempJournalPath(): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'rollserve-journal-'));
  dirs.push(dir);
  return join(dir, 'j.jsonl');
}

/** Counts the journal's write and fdatasync calls (every FileHandle shares one prototype). */
async function spyOnFileHandles(path: string) {
  const probe = await open(path, 'a');
  const proto = Object.getPrototypeOf(probe) as { write: () => unknown; datasync: () => unknown };
  await probe.close();
  const writes = vi.spyOn(proto, 'write');
  const syncs = vi.spyOn(proto, 'datasync');
  return { writes, syncs, restore: () => (writes.mockRestore(), syncs.mockRestore()) };
}

const taskRecord = (id: string) => ({ type: 'task' as const, taskId: id, task: task(id), rolloutIds: [id], at: 'now' });

describe('journal', () => {
  it('writes a batch of records with one write and one fsync', async () => {
    const path = await tempJournalPath();
    const { journal } = await Journal.open(path, { fsync: true });
    const spies = await spyOnFileHandles(path);
    try {
      const ids = Array.from({ length: 1_000 }, (_, i) => `t${i}`);
      await journal.append(ids.map(taskRecord));
      expect(spies.writes).toHaveBeenCalledTimes(1);
      expect(spies.syncs).toHaveBeenCalledTimes(1);
      await journal.close();
      expect([...(await Journal.read(path)).tasks.keys()]).toEqual(ids);
    } finally {
      spies.restore();
    }
  });

  it('groups records appended while a write is under way into the next write', async () => {
    const path = await tempJournalPath();
    const { journal } = await Journal.open(path, { fsync: true });
    const spies = await spyOnFileHandles(path);
    try {
      const ids = Array.from({ length: 200 }, (_, i) => `r${i}`);
      // one append per record, all at once, as results finishing together do
      await Promise.all(ids.map((id) => journal.append(taskRecord(id))));
      expect(spies.writes.mock.calls.length).toBeLessThanOrEqual(2); // the first alone, the rest together
      expect(spies.syncs.mock.calls.length).toBe(spies.writes.mock.calls.length);
      await journal.close();
      expect([...(await Journal.read(path)).tasks.keys()]).toEqual(ids); // in append order
    } finally {
      spies.restore();
    }
  });

  it('without fsync, writes the records appended in one tick with one write', async () => {
    const path = await tempJournalPath();
    const { journal } = await Journal.open(path);
    const writes = vi.spyOn(fs, 'writeSync');
    try {
      const ids = Array.from({ length: 200 }, (_, i) => `s${i}`);
      await Promise.all(ids.map((id) => journal.append(taskRecord(id))));
      expect(writes).toHaveBeenCalledTimes(1);
      await journal.close();
      expect([...(await Journal.read(path)).tasks.keys()]).toEqual(ids);
    } finally {
      writes.mockRestore();
    }
  });

  it('answers every append made before close, and refuses those after it', async () => {
    const path = await tempJournalPath();
    const { journal } = await Journal.open(path);
    const appended = [journal.append(taskRecord('a')), journal.append(taskRecord('b'))];
    await journal.close();
    await Promise.all(appended);
    await expect(journal.append(taskRecord('c'))).rejects.toThrow(/closed/);
    expect([...(await Journal.read(path)).tasks.keys()]).toEqual(['a', 'b']);
  });

  it('starts on a fresh line after a failed write, so the next record is not glued to a partial one', async () => {
    const path = await tempJournalPath();
    const { journal } = await Journal.open(path);
    const real = fs.writeSync.bind(fs);
    // a disk that fills up: part of the record is written, then the write fails
    const write = vi.spyOn(fs, 'writeSync').mockImplementationOnce((fd: number, buffer: unknown) => {
      real(fd, (buffer as Buffer).subarray(0, 20), 0, 20, null);
      throw Object.assign(new Error('no space left on device'), { code: 'ENOSPC' });
    });
    try {
      await expect(journal.append(taskRecord('lost'))).rejects.toThrow(/no space/);
      await journal.append(taskRecord('kept'));
      await journal.close();
      const contents = await Journal.read(path);
      expect([...contents.tasks.keys()]).toEqual(['kept']);
      expect(contents.skippedLines).toBe(1);
    } finally {
      write.mockRestore();
    }
  });

  it('with fsync, starts on a fresh line after a failed write too', async () => {
    const path = await tempJournalPath();
    const { journal } = await Journal.open(path, { fsync: true });
    const probe = await open(path, 'a');
    const proto = Object.getPrototypeOf(probe) as { write: (...args: unknown[]) => Promise<{ bytesWritten: number }> };
    await probe.close();
    const real = proto.write;
    // a disk that fills up: part of the record is written, then the write fails
    const write = vi.spyOn(proto, 'write').mockImplementationOnce(async function (this: unknown, buffer: unknown) {
      await real.call(this, (buffer as Buffer).subarray(0, 20), 0, 20, null);
      throw Object.assign(new Error('no space left on device'), { code: 'ENOSPC' });
    });
    try {
      await expect(journal.append(taskRecord('lost'))).rejects.toThrow(/no space/);
      await journal.append(taskRecord('kept'));
      await journal.close();
      const contents = await Journal.read(path);
      expect([...contents.tasks.keys()]).toEqual(['kept']);
      expect(contents.skippedLines).toBe(1);
    } finally {
      write.mockRestore();
    }
  });


  it('survives a line cut short by a crash: the next record is not glued to it', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rollserve-journal-'));
    dirs.push(dir);
    const path = join(dir, 'j.jsonl');
    const first = JSON.stringify({ type: 'task', taskId: 'a', task: task('a'), rolloutIds: ['a'], at: 'now' });
    await writeFile(path, `${first}\n{"type":"task","taskId":"b","ta`); // the crash
    const { journal, contents } = await Journal.open(path);
    expect([...contents.tasks.keys()]).toEqual(['a']);
    expect(contents.skippedLines).toBe(1);
    await journal.append({ type: 'task', taskId: 'c', task: task('c'), rolloutIds: ['c'], at: 'later' });
    await journal.close();
    const again = await Journal.read(path);
    expect([...again.tasks.keys()]).toEqual(['a', 'c']);
    expect((await readFile(path, 'utf8')).split('\n').filter(Boolean)).toHaveLength(3);
  });
});
