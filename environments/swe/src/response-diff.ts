import { assistantMessageTexts, type OutputItem } from '@rollserve/core';

const TAGGED = /<([\w-]+)>([\s\S]*?)<\/\1>/g;
const FENCED = /```(\w+)?\n([\s\S]*?)```/g;
const LOOKS_LIKE_DIFF = /^(diff --git |--- \S)/m;

/**
 * The diff in one text as SWE-bench's inference reads a model's answer (`extract_diff`): the
 * first `<patch>`/`<diff>` element or ```diff / ```patch block, else the first other element or
 * block, else the text itself up to `</s>`.
 */
export function extractDiff(text: string): string {
  const diffs: string[] = [];
  const others: string[] = [];
  for (const pattern of [TAGGED, FENCED]) {
    for (const match of text.matchAll(pattern)) {
      (match[1] === 'diff' || match[1] === 'patch' ? diffs : others).push(match[2]!);
    }
  }
  return diffs[0] ?? others[0] ?? text.split('</s>')[0]!;
}

/**
 * The patch a response states (`verify_from: 'response'`): from the last assistant message that
 * holds one, extracted as SWE-bench does; empty when no message looks like a diff.
 */
export function responseDiff(response: { output: readonly OutputItem[] }): string {
  for (const text of assistantMessageTexts(response).reverse()) {
    const diff = extractDiff(text);
    if (LOOKS_LIKE_DIFF.test(diff)) return diff.replace(/^\n+/, '');
  }
  return '';
}
