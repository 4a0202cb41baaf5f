/**
 * The readers both wire formats (live.ts, report.ts) parse with. Each takes a JSON
 * value and the path it was found at, and throws WireFormatError naming that path
 * when the value does not have the documented shape; `null` and absent optional
 * values read as `null` (or an empty list), never as 0.
 */

/** Raised when data on the wire does not have the documented shape. */
export class WireFormatError extends Error {
  constructor(what: string, path: string) {
    super(`${what} at ${path || '(root)'}`);
    this.name = 'WireFormatError';
  }
}

export type Json = Record<string, unknown>;

export function object(value: unknown, path: string): Json {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    throw new WireFormatError('expected an object', path);
  }
  return value as Json;
}

export function array(value: unknown, path: string): unknown[] {
  if (!Array.isArray(value)) {
    throw new WireFormatError('expected an array', path);
  }
  return value;
}

export function num(value: unknown, path: string): number {
  if (typeof value !== 'number' || !Number.isFinite(value)) {
    throw new WireFormatError('expected a number', path);
  }
  return value;
}

export function optNum(value: unknown, path: string): number | null {
  return value === null || value === undefined ? null : num(value, path);
}

export function optStr(value: unknown, path: string): string | null {
  if (value === null || value === undefined) {
    return null;
  }
  if (typeof value !== 'string') {
    throw new WireFormatError('expected a string', path);
  }
  return value;
}

export function strings(value: unknown, path: string): string[] {
  if (value === null || value === undefined) {
    return [];
  }
  return array(value, path).map((v, i) => String(optStr(v, `${path}[${i}]`)));
}

export function numbers(value: unknown, path: string): number[] {
  if (value === null || value === undefined) {
    return [];
  }
  return array(value, path).map((v, i) => num(v, `${path}[${i}]`));
}
