import { describe, expect, it } from 'vitest';
import { extractDiff, responseDiff } from './response-diff.ts';

const DIFF = 'diff --git a/calc/stats.py b/calc/stats.py\n--- a/calc/stats.py\n+++ b/calc/stats.py\n@@ -1 +1 @@\n-a\n+b\n';
const message = (text: string) => ({ type: 'message', role: 'assistant', content: [{ type: 'output_text', text, annotations: [] }] });

describe("the diff in a response (SWE-bench's extract_diff)", () => {
  it('takes a <patch> element or a ```diff block before any other block', () => {
    expect(extractDiff(`Here:\n<patch>\n${DIFF}</patch>\n`)).toBe(`\n${DIFF}`);
    expect(extractDiff(`\`\`\`python\nprint(1)\n\`\`\`\n\`\`\`diff\n${DIFF}\`\`\`\n`)).toBe(DIFF);
    expect(extractDiff('```python\nprint(1)\n```')).toBe('print(1)\n');
    expect(extractDiff(`${DIFF}</s>trailing`)).toBe(DIFF);
  });

  it("reads the last assistant message that holds a diff; none is ''", () => {
    const response = { output: [message(`\`\`\`diff\n${DIFF}\`\`\``), { type: 'function_call', name: 'bash', arguments: '{}', call_id: 'c' }, message('All done.')] };
    expect(responseDiff(response)).toBe(DIFF);
    expect(responseDiff({ output: [message('I could not fix it.')] })).toBe('');
    expect(responseDiff({ output: [] })).toBe('');
  });
});
