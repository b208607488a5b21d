// Float arithmetic as NeMo Gym's Python does it, so that /aggregate_metrics agrees with the Python
// server to the last bit in the common cases (and within 1e-9 always):
// - pandas reductions sum with numpy's pairwise summation (`pySum` is not the same thing);
// - CPython's built-in `sum()` of floats (3.12+) is Neumaier-compensated;
// - `int / int` in Python is correctly rounded even for integers beyond 2^53 (math.comb results).

/** numpy's `pairwise_sum` for float64 (`loops_utils.h.src`), blocks of 8, split above 128. */
function pairwise(values: readonly number[], start: number, n: number): number {
  if (n < 8) {
    let res = 0;
    for (let i = 0; i < n; i++) res += values[start + i]!;
    return res;
  }
  if (n <= 128) {
    const r = values.slice(start, start + 8);
    let i = 8;
    for (; i < n - (n % 8); i += 8) {
      for (let j = 0; j < 8; j++) r[j]! += values[start + i + j]!;
    }
    // numpy adds the eight accumulators in this order.
    let res = ((r[0]! + r[1]!) + (r[2]! + r[3]!)) + ((r[4]! + r[5]!) + (r[6]! + r[7]!));
    for (; i < n; i++) res += values[start + i]!;
    return res;
  }
  let n2 = Math.floor(n / 2);
  n2 -= n2 % 8;
  return pairwise(values, start, n2) + pairwise(values, start + n2, n - n2);
}

/** `np.add.reduce` over a float64 array: the identity 0 plus the pairwise sum. */
export function npSum(values: readonly number[]): number {
  return 0 + pairwise(values, 0, values.length);
}

/**
 * CPython's `sum(values)` of floats: the first item is added to the start value 0, the rest go
 * through Neumaier's compensated summation (`cs_add` / `cs_to_double` in bltinmodule.c).
 */
export function pySum(values: Iterable<number>): number {
  let hi = 0;
  let lo = 0;
  let first = true;
  for (const x of values) {
    if (first) {
      hi = 0 + x;
      first = false;
      continue;
    }
    const t = hi + x;
    if (Math.abs(hi) >= Math.abs(x)) lo += hi - t + x;
    else lo += x - t + hi;
    hi = t;
  }
  return lo !== 0 && Number.isFinite(lo) ? hi + lo : hi;
}

/** `math.comb(n, k)`, exactly. */
export function comb(n: number, k: number): bigint {
  if (k < 0 || k > n) return 0n;
  const m = Math.min(k, n - k);
  let result = 1n;
  for (let i = 1; i <= m; i++) result = (result * BigInt(n - m + i)) / BigInt(i);
  return result;
}

function bitLength(value: bigint): number {
  return value.toString(2).length;
}

/** Python's `a / b` for non-negative ints: the exact quotient rounded once, half to even. */
export function trueDivide(a: bigint, b: bigint): number {
  if (a === 0n) return 0;
  const exact = 2n ** 53n;
  if (a <= exact && b <= exact) return Number(a) / Number(b);
  // A quotient of at least 66 bits plus a sticky bit for the remainder rounds like the exact value.
  const shift = Math.max(0, 66 - (bitLength(a) - bitLength(b)));
  const scaled = a << BigInt(shift);
  const sticky = ((scaled / b) << 1n) | (scaled % b === 0n ? 0n : 1n);
  let result = Number(sticky);
  for (let e = shift + 1; e > 0; e -= 1000) result /= 2 ** Math.min(e, 1000);
  return result;
}

/** Python's `sorted()` order for strings: by code point, not by UTF-16 unit. */
export function compareCodePoints(a: string, b: string): number {
  const x = Array.from(a);
  const y = Array.from(b);
  for (let i = 0; i < Math.min(x.length, y.length); i++) {
    const d = x[i]!.codePointAt(0)! - y[i]!.codePointAt(0)!;
    if (d !== 0) return d;
  }
  return x.length - y.length;
}

/** Python truthiness of a JSON value (NaN is truthy there). */
export function pyTruthy(value: unknown): boolean {
  if (value === null || value === undefined || value === false || value === 0 || value === '') return false;
  if (Array.isArray(value)) return value.length > 0;
  if (typeof value === 'object') return Object.keys(value).length > 0;
  return true;
}

/** A key under which JSON values are equal exactly when Python's `==` (and hash) says so. */
export function pyHashKey(value: unknown): string {
  if (typeof value === 'string') return `s${value}`;
  if (typeof value === 'boolean') return `n${value ? 1 : 0}`;
  if (typeof value === 'number') return `n${Object.is(value, -0) ? 0 : value}`;
  return `j${JSON.stringify(value)}`;
}

/** `str(value)` for a JSON value, as an f-string would print it. */
export function pyStr(value: unknown): string {
  if (typeof value === 'string') return value;
  if (typeof value === 'boolean') return value ? 'True' : 'False';
  if (value === null || value === undefined) return 'None';
  if (typeof value === 'number') return String(value);
  return JSON.stringify(value);
}

/** Python's `isinstance(v, bool) → int(v)`, `isinstance(v, (int, float)) → v`, else nothing. */
export function numeric(value: unknown): number | undefined {
  if (typeof value === 'boolean') return value ? 1 : 0;
  return typeof value === 'number' ? value : undefined;
}

/** `max(values)` of numbers (-Infinity for none), without spreading a long list onto the stack. */
export function maxOf(values: readonly number[]): number {
  let max = -Infinity;
  for (const v of values) if (v > max) max = v;
  return max;
}

/** `min(values)` of numbers (Infinity for none), without spreading a long list onto the stack. */
export function minOf(values: readonly number[]): number {
  let min = Infinity;
  for (const v of values) if (v < min) min = v;
  return min;
}
