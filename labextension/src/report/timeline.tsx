/**
 * A report's memory timeline: allocated and reserved bytes over the cell, the
 * training phases as translucent bands and the peak marked.
 *
 * The lines and bands are drawn in a stretched viewBox (so the chart fills the
 * output's width without measuring it); the peak's dot and leader sit in the
 * outer SVG at percentage coordinates, and the axis labels and the peak's label
 * are HTML, so that none is distorted by the stretch. As in the kernel's SVG
 * (the timeline in the report's own text/html), the peak's label has its own row above
 * the plot area, where no curve runs, and reserved memory is drawn only where it
 * is not allocated memory again (on the CPU the two are one series).
 */
import * as React from 'react';

import { formatBytes, formatSeconds, Units } from '../format';
import { ITimeline } from '../wire';
import { phaseOf, PHASES } from './categories';

/** The y axis ends a little above the largest value (as the kernel's SVG does). */
const HEADROOM = 1.08;
/** The viewBox of the stretched drawing: x in [0, W], y in [0, H] (percent). */
const W = 1000;
const H = 100;
/** Pixels the peak's leader reaches up out of the plot area, towards its label. */
const LEADER_OVERHANG = 3;

/** Where a timeline's largest value and its end are, and its peak. */
export interface ITimelineScale {
  end_s: number;
  top_bytes: number;
  peak_t_s: number;
  peak_bytes: number;
}

/**
 * The axes' extent and the peak of a timeline; the peak falls back to the
 * largest allocated point when the kernel did not say.
 */
export function timelineScale(timeline: ITimeline): ITimelineScale {
  const n = Math.min(timeline.t_s.length, timeline.allocated_bytes.length);
  let peak_t_s = timeline.peak_t_s;
  let peak_bytes = timeline.peak_bytes;
  if (peak_t_s === null || peak_bytes === null) {
    let best = -1;
    for (let i = 0; i < n; i++) {
      if (best < 0 || timeline.allocated_bytes[i] > timeline.allocated_bytes[best]) {
        best = i;
      }
    }
    peak_t_s = best < 0 ? 0 : timeline.t_s[best];
    peak_bytes = best < 0 ? 0 : timeline.allocated_bytes[best];
  }
  const end_s = Math.max(0, ...timeline.t_s, ...timeline.bands.map(b => b.end_s), peak_t_s);
  const top_bytes = Math.max(
    0,
    ...timeline.allocated_bytes,
    ...timeline.reserved_bytes,
    peak_bytes
  );
  return { end_s, top_bytes, peak_t_s, peak_bytes };
}

/** An SVG path through the points of one series (`M x,y L x,y ...`); empty without points. */
export function seriesPath(
  t_s: number[],
  bytes: number[],
  scale: ITimelineScale
): string {
  const n = Math.min(t_s.length, bytes.length);
  const x = (t: number) => ((t / (scale.end_s || 1)) * W).toFixed(2);
  const y = (b: number) => (H - (b / (scale.top_bytes * HEADROOM || 1)) * H).toFixed(2);
  const points: string[] = [];
  for (let i = 0; i < n; i++) {
    points.push(`${x(t_s[i])},${y(bytes[i])}`);
  }
  return points.length ? `M${points.join(' L')}` : '';
}

/** One line of the chart: its key (a CSS modifier), legend label and bytes. */
export interface ISeries {
  key: 'allocated' | 'reserved';
  label: string;
  bytes: number[];
}

function sameValues(a: number[], b: number[]): boolean {
  return a.length === b.length && a.every((v, i) => v === b[i]);
}

/** The series worth drawing, back to front: reserved only when it is not allocated again. */
export function timelineSeries(timeline: ITimeline): ISeries[] {
  const out: ISeries[] = [];
  const { allocated_bytes, reserved_bytes } = timeline;
  if (reserved_bytes.length && !sameValues(reserved_bytes, allocated_bytes)) {
    out.push({ key: 'reserved', label: 'Reserved', bytes: reserved_bytes });
  }
  if (allocated_bytes.length) {
    out.push({ key: 'allocated', label: 'Allocated', bytes: allocated_bytes });
  }
  return out;
}

/** How a label at `fraction` of the width is aligned to stay inside (as in the kernel's SVG). */
export function labelAlign(fraction: number): 'start' | 'middle' | 'end' {
  return fraction < 0.3 ? 'start' : fraction > 0.7 ? 'end' : 'middle';
}

/** `peak 782 MiB at 0.6 ms` */
export function peakText(scale: ITimelineScale, units: Units): string {
  return `peak ${formatBytes(scale.peak_bytes, units)} at ${formatSeconds(scale.peak_t_s)}`;
}

function percent(value: number): string {
  return `${Math.min(Math.max(value, 0), 100).toFixed(2)}%`;
}

/** The chart, about 120 px high and as wide as the output; null for fewer than two points. */
export function TimelineChart(props: {
  timeline: ITimeline;
  units: Units;
  label: string;
}): JSX.Element | null {
  const { timeline, units } = props;
  if (Math.min(timeline.t_s.length, timeline.allocated_bytes.length) < 2) {
    return null;
  }
  const scale = timelineScale(timeline);
  const top = scale.top_bytes * HEADROOM || 1;
  const end = scale.end_s || 1;
  const xPct = (t: number) => (t / end) * 100;
  const yPct = (b: number) => 100 - (b / top) * 100;
  const peakX = xPct(scale.peak_t_s);
  const peakY = yPct(scale.peak_bytes);
  const peak = peakText(scale, units);
  const title = `${props.label}: ${peak}`;
  const phases = PHASES.filter(p => timeline.bands.some(b => phaseOf(b.phase).key === p.key));
  const series = timelineSeries(timeline);
  const align = labelAlign(peakX / 100);
  return (
    <figure className="jp-GpuMem-timeline">
      <div className="jp-GpuMem-timelinePlot">
        <div />
        <div className="jp-GpuMem-timelinePeakRow">
          <span
            className={`jp-GpuMem-timelinePeakLabel jp-mod-${align}`}
            style={{ left: percent(peakX) }}
          >
            {peak}
          </span>
        </div>
        <div className="jp-GpuMem-timelineYAxis" aria-hidden="true">
          <span style={{ top: percent(yPct(scale.top_bytes)) }}>
            {formatBytes(scale.top_bytes, units)}
          </span>
          <span style={{ top: '100%' }}>{formatBytes(0, units)}</span>
        </div>
        <svg className="jp-GpuMem-timelineSvg" role="img" aria-label={title}>
          <title>{title}</title>
          <svg
            className="jp-GpuMem-timelineDrawing"
            viewBox={`0 0 ${W} ${H}`}
            preserveAspectRatio="none"
            width="100%"
            height="100%"
          >
            {timeline.bands.map((band, i) => {
              const x0 = (Math.max(band.start_s, 0) / end) * W;
              const x1 = (Math.max(band.end_s, band.start_s) / end) * W;
              return (
                <rect
                  key={i}
                  className={`jp-GpuMem-band jp-GpuMem-seg-${phaseOf(band.phase).color}`}
                  data-phase={phaseOf(band.phase).key}
                  x={x0.toFixed(2)}
                  y={0}
                  width={Math.max(x1 - x0, 0.5).toFixed(2)}
                  height={H}
                >
                  <title>
                    {band.phase}
                    {band.step !== null ? `, step ${band.step}` : ''}
                  </title>
                </rect>
              );
            })}
            <line
              className="jp-GpuMem-timelineGrid"
              x1={0}
              x2={W}
              y1={((yPct(scale.top_bytes) / 100) * H).toFixed(2)}
              y2={((yPct(scale.top_bytes) / 100) * H).toFixed(2)}
            />
            <path className="jp-GpuMem-timelineAxis" d={`M0,0 V${H} H${W}`} />
            {series.map(s => (
              <path
                key={s.key}
                className={`jp-GpuMem-series jp-mod-${s.key}`}
                data-series={s.key}
                d={seriesPath(timeline.t_s, s.bytes, scale)}
              />
            ))}
          </svg>
          <line
            className="jp-GpuMem-timelinePeakLeader"
            x1={percent(peakX)}
            x2={percent(peakX)}
            y1={-LEADER_OVERHANG}
            y2={percent(peakY)}
          />
          <circle
            className="jp-GpuMem-timelinePeak"
            cx={percent(peakX)}
            cy={percent(peakY)}
            r={4}
          >
            <title>{peak}</title>
          </circle>
        </svg>
        <div />
        <div className="jp-GpuMem-timelineXAxis" aria-hidden="true">
          <span>0</span>
          <span>{formatSeconds(scale.end_s)}</span>
        </div>
      </div>
      <ul className="jp-GpuMem-legend jp-GpuMem-timelineLegend">
        {[...series].reverse().map(s => (
          <li key={s.key} className="jp-GpuMem-legendItem">
            <span className={`jp-GpuMem-lineSwatch jp-mod-${s.key}`} />
            <span className="jp-GpuMem-legendLabel">{s.label}</span>
          </li>
        ))}
        {phases.map(p => (
          <li key={p.key} className="jp-GpuMem-legendItem">
            <span className={`jp-GpuMem-swatch jp-GpuMem-bandSwatch jp-GpuMem-seg-${p.color}`} />
            <span className="jp-GpuMem-legendLabel">{p.label}</span>
          </li>
        ))}
      </ul>
    </figure>
  );
}
