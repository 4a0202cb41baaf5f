/**
 * The live view's small charts: a gauge and a sparkline. SVG and CSS only; every
 * colour comes from a `--jp-*` theme variable, or from a class with a light and a
 * dark value (see style/base.css).
 */
import * as React from 'react';

import { formatBytes, formatFraction, formatSeconds, formatUsedTotal, Units } from '../format';
import { IPoint } from './model';

/** Share of a total in [0, 1], or null when either side is unknown. */
export function fraction(used: number | null, total: number | null | undefined): number | null {
  if (used === null || !total || total <= 0) {
    return null;
  }
  return Math.min(Math.max(used / total, 0), 1);
}

/** `level` classes: a gauge turns amber past 75% and red past 90%. */
export function level(share: number | null): 'ok' | 'warn' | 'high' | 'unknown' {
  if (share === null) {
    return 'unknown';
  }
  return share >= 0.9 ? 'high' : share >= 0.75 ? 'warn' : 'ok';
}

export function Gauge(props: {
  used: number | null;
  total: number | null;
  units: Units;
  label?: string;
  /** "used of total" with each side in its own unit (`"357 MiB of 23.5 GiB"`), for small shares. */
  ofTotal?: boolean;
}): JSX.Element {
  const share = fraction(props.used, props.total);
  const amounts = props.ofTotal
    ? `${formatBytes(props.used, props.units)} of ${formatBytes(props.total, props.units)}`
    : formatUsedTotal(props.used, props.total, props.units);
  const text = `${amounts}${share === null ? '' : ` (${formatFraction(share)})`}`;
  return (
    <div
      className="jp-GpuMem-gauge"
      role="meter"
      aria-label={props.label ?? 'memory used'}
      aria-valuemin={0}
      aria-valuemax={props.total ?? undefined}
      aria-valuenow={props.used ?? undefined}
      aria-valuetext={text}
    >
      <div className="jp-GpuMem-gaugeTrack">
        <div
          className={`jp-GpuMem-gaugeFill jp-mod-${level(share)}`}
          style={{ width: `${((share ?? 0) * 100).toFixed(1)}%` }}
        />
      </div>
      <div className="jp-GpuMem-gaugeText">{text}</div>
    </div>
  );
}

const SPARK_W = 200;
const SPARK_H = 36;

/** The sparkline never spans less than this, so that a new server's first points do not fill it. */
const MIN_SPAN_S = 60;

/**
 * Memory used over the last `window_s` seconds (ending at the newest point), as a
 * share of `total`. Until there is that much history, the span is what there is
 * (at least a minute). Gaps in the data (unknown values) break the line.
 */
export function Sparkline(props: {
  points: IPoint[];
  total: number | null;
  window_s: number;
  units: Units;
}): JSX.Element {
  const { points, total, window_s } = props;
  const end = points.length ? points[points.length - 1].time : 0;
  const first = points.length ? points[0].time : 0;
  const span = Math.min(window_s, Math.max(end - first, MIN_SPAN_S));
  const start = end - span;
  const x = (t: number) => ((t - start) / span) * SPARK_W;
  const y = (bytes: number) => SPARK_H - (fraction(bytes, total) ?? 0) * (SPARK_H - 2) - 1;

  const runs: string[][] = [];
  let run: string[] = [];
  for (const p of points) {
    if (p.used_bytes === null || !total) {
      if (run.length) {
        runs.push(run);
      }
      run = [];
      continue;
    }
    run.push(`${x(p.time).toFixed(1)},${y(p.used_bytes).toFixed(1)}`);
  }
  if (run.length) {
    runs.push(run);
  }
  const peak = points.reduce<number | null>(
    (m, p) => (p.used_bytes !== null && (m === null || p.used_bytes > m) ? p.used_bytes : m),
    null
  );
  const title = `memory used, last ${formatSeconds(span)}; peak ${formatBytes(peak, props.units)}`;
  return (
    <svg
      className="jp-GpuMem-sparkline"
      viewBox={`0 0 ${SPARK_W} ${SPARK_H}`}
      preserveAspectRatio="none"
      role="img"
      aria-label={title}
    >
      <title>{title}</title>
      <rect className="jp-GpuMem-sparkBg" x={0} y={0} width={SPARK_W} height={SPARK_H} />
      {runs.map((r, i) => (
        <React.Fragment key={i}>
          <polygon
            className="jp-GpuMem-sparkArea"
            points={`${r[0].split(',')[0]},${SPARK_H} ${r.join(' ')} ${
              r[r.length - 1].split(',')[0]
            },${SPARK_H}`}
          />
          <polyline className="jp-GpuMem-sparkLine" points={r.join(' ')} />
        </React.Fragment>
      ))}
    </svg>
  );
}
