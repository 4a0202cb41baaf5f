/**
 * The stacked bar of a report's breakdown (at the peak, or when memory ran out). CSS
 * only; every colour comes from a `jp-GpuMem-seg-N` class with a light and a dark value
 * (see style/base.css).
 */
import * as React from 'react';

import { formatBytes, formatFraction, Units } from '../format';

/** One segment of a stacked bar. */
export interface ISegment {
  key: string;
  label: string;
  bytes: number;
  /** Colour class `jp-GpuMem-seg-N` (0-16, categories.ts); the position (0-13) when absent. */
  color?: number;
}

/**
 * Segments side by side in proportion to their bytes, with a legend. Colours
 * come from `jp-GpuMem-seg-N` classes, so that they follow the theme.
 */
export function StackedBar(props: {
  segments: ISegment[];
  units: Units;
  label: string;
}): JSX.Element {
  const total = props.segments.reduce((s, seg) => s + Math.max(seg.bytes, 0), 0);
  return (
    <div className="jp-GpuMem-stacked">
      <div className="jp-GpuMem-stackedBar" role="img" aria-label={props.label}>
        {props.segments.map((seg, i) =>
          seg.bytes > 0 && total > 0 ? (
            <div
              key={seg.key}
              className={`jp-GpuMem-seg jp-GpuMem-seg-${seg.color ?? i % 14}`}
              style={{ width: `${((seg.bytes / total) * 100).toFixed(2)}%` }}
              title={`${seg.label}: ${formatBytes(seg.bytes, props.units)}`}
            />
          ) : null
        )}
      </div>
      <ul className="jp-GpuMem-legend">
        {props.segments.map((seg, i) => (
          <li key={seg.key} className="jp-GpuMem-legendItem">
            <span className={`jp-GpuMem-swatch jp-GpuMem-seg-${seg.color ?? i % 14}`} />
            <span className="jp-GpuMem-legendLabel">{seg.label}</span>
            <span className="jp-GpuMem-legendValue">
              {formatBytes(seg.bytes, props.units)}
              {total > 0 ? ` · ${formatFraction(seg.bytes / total)}` : ''}
            </span>
          </li>
        ))}
      </ul>
    </div>
  );
}
