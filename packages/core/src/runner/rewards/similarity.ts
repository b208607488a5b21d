import { RolloutError } from '../../errors.ts';
import type { CreditSettings } from '../../protocol/rollout.ts';

/** Compares code: cosine similarities between every text of `a` and every text of `b`. */
export interface CodeSimilarity {
  /** `matrix[i][j]` = cos(a[i], b[j]); an empty text is 0 to everything. */
  matrix(a: readonly string[], b: readonly string[]): Promise<number[][]>;
}

const TOKEN = /[A-Za-z_][A-Za-z0-9_]*|\d+(?:\.\d+)?|[^\sA-Za-z0-9_]/g;

/** Counts of a text's token 1-grams and 2-grams (identifiers, numbers, single symbols). */
export function lexicalFeatures(text: string): Map<string, number> {
  const tokens = text.match(TOKEN) ?? [];
  const counts = new Map<string, number>();
  const add = (key: string) => counts.set(key, (counts.get(key) ?? 0) + 1);
  tokens.forEach((token, i) => {
    add(`1 ${token}`);
    if (i > 0) add(`2 ${tokens[i - 1]} ${token}`);
  });
  return counts;
}

function sparseCosine(a: Map<string, number>, b: Map<string, number>): number {
  let dot = 0;
  for (const [key, value] of a) dot += value * (b.get(key) ?? 0);
  const norm = (m: Map<string, number>) => Math.sqrt([...m.values()].reduce((s, v) => s + v * v, 0));
  const denominator = norm(a) * norm(b);
  return denominator === 0 ? 0 : dot / denominator;
}

export function denseCosine(a: readonly number[], b: readonly number[]): number {
  let dot = 0;
  let na = 0;
  let nb = 0;
  for (let i = 0; i < a.length; i++) {
    dot += a[i]! * (b[i] ?? 0);
    na += a[i]! * a[i]!;
  }
  for (const v of b) nb += v * v;
  const denominator = Math.sqrt(na) * Math.sqrt(nb);
  return denominator === 0 ? 0 : dot / denominator;
}

/** Cosine of token 1- and 2-gram count vectors: deterministic, no model. */
export function lexicalSimilarity(): CodeSimilarity {
  return {
    async matrix(a, b) {
      const fb = b.map(lexicalFeatures);
      return a.map((text) => {
        const fa = lexicalFeatures(text);
        return fb.map((f) => sparseCosine(fa, f));
      });
    },
  };
}

/** Cosine of embeddings from an OpenAI-compatible `POST <url>/embeddings` (vLLM embedding models). */
export function embeddingSimilarity(options: { url: string; model: string; apiKey?: string; timeoutMs?: number }): CodeSimilarity {
  const endpoint = `${options.url.replace(/\/+$/, '')}/embeddings`;
  const fail = (message: string, cause?: unknown) =>
    new RolloutError({ code: 'UNAVAILABLE', message: `embeddings endpoint ${endpoint} (model ${options.model}): ${message}`, cause, retryable: true });
  const embed = async (inputs: string[]): Promise<number[][]> => {
    let response: Response;
    try {
      response = await fetch(endpoint, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...(options.apiKey ? { authorization: `Bearer ${options.apiKey}` } : {}) },
        body: JSON.stringify({ model: options.model, input: inputs }),
        signal: AbortSignal.timeout(options.timeoutMs ?? 30_000),
      });
    } catch (error) {
      const cause = (error as { cause?: { code?: string; message?: string } }).cause;
      throw fail(`unreachable (${cause?.code ?? cause?.message ?? (error as Error).message})`, error);
    }
    const text = await response.text().catch(() => '');
    if (!response.ok) throw fail(`answered HTTP ${response.status}: ${text.slice(0, 200)}`);
    let body: { data?: Array<{ embedding?: unknown; index?: unknown }> };
    try {
      body = JSON.parse(text) as typeof body;
    } catch {
      throw fail(`answered something that is not JSON: ${text.slice(0, 200)}`);
    }
    const vectors = new Array<number[] | undefined>(inputs.length);
    (body.data ?? []).forEach((item, position) => {
      const index = typeof item.index === 'number' ? item.index : position;
      if (Array.isArray(item.embedding) && item.embedding.every((v) => typeof v === 'number' && Number.isFinite(v))) vectors[index] = item.embedding as number[];
    });
    if (vectors.some((v) => v === undefined) || vectors.length !== inputs.length) throw fail(`answered ${body.data?.length ?? 0} usable embeddings for ${inputs.length} inputs`);
    return vectors as number[][];
  };
  return {
    async matrix(a, b) {
      const unique = [...new Set([...a, ...b].filter((t) => t !== ''))];
      if (unique.length === 0) return a.map(() => b.map(() => 0));
      const vectors = await embed(unique);
      const of = new Map(unique.map((t, i) => [t, vectors[i]!]));
      return a.map((x) => b.map((y) => (x === '' || y === '' ? 0 : denseCosine(of.get(x)!, of.get(y)!))));
    },
  };
}

/** The similarity a task's shaping settings name. */
export function similarityFor(spec: CreditSettings['shaping']['similarity']): CodeSimilarity {
  if (spec === 'lexical') return lexicalSimilarity();
  return embeddingSimilarity({ url: spec.url, model: spec.model, timeoutMs: spec.timeout_s * 1000, ...(spec.api_key ? { apiKey: spec.api_key } : {}) });
}
