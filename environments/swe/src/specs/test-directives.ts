// Which tests SWE-bench runs: the files test_patch touches (`get_test_directives`), not the ids.

/** Files SWE-bench never hands the test runner (its NON_TEST_EXTS; "csv" has no dot there). */
export const NON_TEST_EXTS = ['.json', '.png', 'csv', '.txt', '.md', '.jpg', '.jpeg', '.pkl', '.yml', '.yaml', '.toml'];

/**
 * The `b/` paths of the `diff --git a/... b/...` lines of a patch, in order, non-test files left
 * out: SWE-bench's test directives before any per-runner transform.
 */
export function testFilesOfPatch(testPatch: string): string[] {
  const files: string[] = [];
  for (const line of testPatch.split('\n')) {
    // `diff --git a/.* b/(.*)` anywhere in the line; the greedy `.*` makes it the last " b/"
    const start = line.indexOf('diff --git a/');
    if (start < 0) continue;
    const at = line.lastIndexOf(' b/');
    if (at < start + 'diff --git a/'.length) continue;
    const file = line.slice(at + 3).replace(/\r$/, '');
    if (!NON_TEST_EXTS.some((ext) => file.endsWith(ext))) files.push(file);
  }
  return files;
}
