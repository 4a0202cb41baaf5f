/**
 * The one place where raw numbers become text. Everything else stores bytes as
 * integers and seconds as floats and calls these at the edge.
 */

/** Binary (GiB, 1024-based) or decimal (GB, 1000-based) units, as in the settings. */
export type Units = 'GiB' | 'GB';

/** Shown for a value the server or kernel could not measure. */
export const UNKNOWN = '–';

const PREFIXES: Record<Units, { base: number; names: string[] }> = {
  GiB: { base: 1024, names: ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'] },
  GB: { base: 1000, names: ['B', 'kB', 'MB', 'GB', 'TB', 'PB'] }
};

function isNumber(value: unknown): value is number {
  return typeof value === 'number' && Number.isFinite(value);
}

/** Three significant digits, but never scientific notation and no trailing ".0". */
function trim(value: number): string {
  const abs = Math.abs(value);
  const digits = abs >= 100 ? 0 : abs >= 10 ? 1 : 2;
  return String(Number(value.toFixed(digits)));
}

/** Index of the prefix that keeps `bytes` in [1, base) (bytes below 1 kB stay in B). */
function exponentFor(bytes: number, units: Units): number {
  const { base, names } = PREFIXES[units];
  const abs = Math.abs(bytes);
  if (abs < base) {
    return 0;
  }
  return Math.min(Math.floor(Math.log(abs) / Math.log(base)), names.length - 1);
}

/** `1610612736` -> `"1.5 GiB"`; `null` -> `"–"`. */
export function formatBytes(
  bytes: number | null | undefined,
  units: Units = 'GiB'
): string {
  if (!isNumber(bytes)) {
    return UNKNOWN;
  }
  const { base, names } = PREFIXES[units];
  const exp = exponentFor(bytes, units);
  if (exp === 0) {
    return `${Math.round(bytes)} B`;
  }
  return `${trim(bytes / Math.pow(base, exp))} ${names[exp]}`;
}

/**
 * Used over total in the unit of the total: `"12.3/80 GiB"`. Either side may be
 * unknown (`"–/80 GiB"`, `"12.3 GiB/–"`).
 */
export function formatUsedTotal(
  used: number | null | undefined,
  total: number | null | undefined,
  units: Units = 'GiB'
): string {
  if (!isNumber(total)) {
    return `${formatBytes(used, units)}/${UNKNOWN}`;
  }
  const { base, names } = PREFIXES[units];
  const exp = exponentFor(total, units);
  const scale = Math.pow(base, exp);
  const usedText = isNumber(used) ? trim(used / scale) : UNKNOWN;
  return `${usedText}/${trim(total / scale)} ${names[exp]}`;
}

/** `0.0004` -> `"0.4 ms"`, `3.4178` -> `"3.42 s"`, `125` -> `"2 min 5 s"`. */
export function formatSeconds(seconds: number | null | undefined): string {
  if (!isNumber(seconds)) {
    return UNKNOWN;
  }
  const abs = Math.abs(seconds);
  if (abs < 1) {
    return `${trim(seconds * 1000)} ms`;
  }
  if (abs < 60) {
    return `${trim(seconds)} s`;
  }
  const minutes = Math.floor(abs / 60);
  const rest = Math.round(abs - minutes * 60);
  const sign = seconds < 0 ? '-' : '';
  if (minutes < 60) {
    return rest ? `${sign}${minutes} min ${rest} s` : `${sign}${minutes} min`;
  }
  return `${sign}${Math.floor(minutes / 60)} h ${minutes % 60} min`;
}

/** `0.4567` -> `"46%"`; a fraction of 1, not a percent. */
export function formatFraction(fraction: number | null | undefined): string {
  if (!isNumber(fraction)) {
    return UNKNOWN;
  }
  return `${Math.round(fraction * 100)}%`;
}

/** `87` -> `"87%"`; for values that already are percents (NVML utilisation). */
export function formatPercent(percent: number | null | undefined): string {
  if (!isNumber(percent)) {
    return UNKNOWN;
  }
  return `${Math.round(percent)}%`;
}

/**
 * The unit chosen in the settings. The report renderer is created by the
 * rendermime registry, which cannot pass it settings, so the main plugin keeps
 * this one value up to date for it.
 */
export const unitPreference: { units: Units } = { units: 'GiB' };
