import * as React from 'react';

import { fixture, render } from '../../__tests__/helpers';
import { ITimeline, parseReport } from '../../wire';
import {
  labelAlign,
  peakText,
  seriesPath,
  TimelineChart,
  timelineScale,
  timelineSeries
} from '../timeline';

const GPU = 'report_gpu_training_step.json';
/** Recorded on the CPU, where reserved memory is allocated memory (the same series). */
const CPU = 'report_cpu_training_step.json';
/** Report schema 2: a `generate` call, one prefill band and a decode band per new token. */
const GENERATE = 'report_gpu_generate.json';

function timelineOf(name: string): ITimeline {
  const timeline = parseReport(fixture(name)).devices[0].timeline;
  expect(timeline).not.toBeNull();
  return timeline as ITimeline;
}

function gpuTimeline(): ITimeline {
  return timelineOf(GPU);
}

describe('timelineScale', () => {
  it('spans the recorded cell and keeps the kernel’s peak', () => {
    const scale = timelineScale(gpuTimeline());
    expect(scale.end_s).toBeCloseTo(0.007307);
    expect(scale.top_bytes).toBe(3386900480); // reserved is the largest series
    expect(scale.peak_bytes).toBe(820098048);
    expect(scale.peak_t_s).toBeCloseTo(0.000603);
  });

  it('finds the peak itself when the kernel did not say', () => {
    const scale = timelineScale({
      t_s: [0, 1, 2],
      allocated_bytes: [1, 5, 2],
      reserved_bytes: [],
      bands: [],
      peak_t_s: null,
      peak_bytes: null
    });
    expect(scale.peak_t_s).toBe(1);
    expect(scale.peak_bytes).toBe(5);
    expect(scale.end_s).toBe(2);
  });
});

describe('seriesPath', () => {
  it('has one point per sample, in the stretched viewBox', () => {
    const timeline = gpuTimeline();
    const path = seriesPath(timeline.t_s, timeline.allocated_bytes, timelineScale(timeline));
    expect(path.startsWith('M0.00,')).toBe(true);
    expect(path.split(' L')).toHaveLength(timeline.t_s.length);
    expect(path.endsWith(' L1000.00,' + path.split(',').pop())).toBe(true);
  });

  it('stops at the shorter of two mismatched arrays', () => {
    const scale = { end_s: 2, top_bytes: 10, peak_t_s: 0, peak_bytes: 0 };
    expect(seriesPath([0, 1, 2], [0, 10], scale).split(' L')).toHaveLength(2);
    expect(seriesPath([], [], scale)).toBe('');
  });
});

describe('TimelineChart', () => {
  it('draws a path per series, the phase bands and a marker at the peak', () => {
    const timeline = gpuTimeline();
    const host = render(<TimelineChart timeline={timeline} units="GiB" label="cell" />);
    const svg = host.querySelector('svg.jp-GpuMem-timelineSvg');
    expect(svg).not.toBeNull();
    const paths = host.querySelectorAll('path.jp-GpuMem-series');
    expect(Array.from(paths).map(p => p.getAttribute('data-series'))).toEqual([
      'reserved',
      'allocated'
    ]);
    for (const p of Array.from(paths)) {
      expect(p.getAttribute('d')?.split(' L')).toHaveLength(512);
    }
    // One translucent band per phase of each of the three steps.
    const bands = host.querySelectorAll('rect.jp-GpuMem-band');
    expect(bands).toHaveLength(9);
    expect(Array.from(bands).map(b => b.getAttribute('data-phase')).slice(0, 3)).toEqual([
      'forward',
      'backward',
      'optimizer'
    ]);
    // Bands share the breakdown colours: forward/activations, backward/gradients, optimizer/state.
    expect(bands[0].getAttribute('class')).toContain('jp-GpuMem-seg-4');
    expect(bands[1].getAttribute('class')).toContain('jp-GpuMem-seg-1');
    expect(bands[2].getAttribute('class')).toContain('jp-GpuMem-seg-2');

    const peak = host.querySelectorAll('circle.jp-GpuMem-timelinePeak');
    expect(peak).toHaveLength(1);
    const scale = timelineScale(timeline);
    const cx = parseFloat(peak[0].getAttribute('cx') ?? '');
    const cy = parseFloat(peak[0].getAttribute('cy') ?? '');
    expect(cx).toBeCloseTo((scale.peak_t_s / scale.end_s) * 100, 1);
    expect(cy).toBeCloseTo(100 - (scale.peak_bytes / (scale.top_bytes * 1.08)) * 100, 1);
    expect(host.querySelector('.jp-GpuMem-timelinePeakLabel')?.textContent).toBe(
      'peak 782 MiB at 0.6 ms'
    );
    expect(peakText(scale, 'GB')).toBe('peak 820 MB at 0.6 ms');

    // Axis labels come from the one bytes formatter; the legend names what is drawn.
    expect(host.querySelector('.jp-GpuMem-timelineYAxis')?.textContent).toBe('3.15 GiB0 B');
    expect(host.querySelector('.jp-GpuMem-timelineXAxis')?.textContent).toBe('07.31 ms');
    expect(host.querySelector('.jp-GpuMem-timelineLegend')?.textContent).toBe(
      'AllocatedReservedForwardBackwardOptimizer'
    );
  });

  it('draws reserved memory, line and legend entry, only where it is not allocated again', () => {
    const cpu = timelineOf(CPU);
    expect(cpu.reserved_bytes).toEqual(cpu.allocated_bytes);
    expect(timelineSeries(cpu).map(s => s.key)).toEqual(['allocated']);
    expect(timelineSeries(gpuTimeline()).map(s => s.key)).toEqual(['reserved', 'allocated']);
    expect(timelineSeries({ ...cpu, reserved_bytes: [] }).map(s => s.key)).toEqual([
      'allocated'
    ]);

    const host = render(<TimelineChart timeline={cpu} units="GiB" label="cell" />);
    const paths = Array.from(host.querySelectorAll('path.jp-GpuMem-series'));
    expect(paths.map(p => p.getAttribute('data-series'))).toEqual(['allocated']);
    expect(host.querySelectorAll('.jp-GpuMem-lineSwatch')).toHaveLength(1);
    expect(host.querySelector('.jp-GpuMem-timelineLegend')?.textContent).toBe(
      'AllocatedForwardBackwardOptimizer'
    );
  });

  it('draws and lists the prefill and decode bands of a generate call', () => {
    const timeline = timelineOf(GENERATE);
    const host = render(<TimelineChart timeline={timeline} units="GiB" label="cell" />);
    const bands = Array.from(host.querySelectorAll('rect.jp-GpuMem-band'));
    expect(bands).toHaveLength(timeline.bands.length);
    const prefill = bands.filter(b => b.getAttribute('data-phase') === 'prefill');
    const decode = bands.filter(b => b.getAttribute('data-phase') === 'decode');
    expect(prefill).toHaveLength(1);
    expect(decode).toHaveLength(bands.length - 1);
    // Prefill in the colour of inputs, decode in the colour of the KV cache it grows.
    expect(prefill[0].getAttribute('class')).toContain('jp-GpuMem-seg-5');
    expect(decode[0].getAttribute('class')).toContain('jp-GpuMem-seg-14');
    const legend = host.querySelector('.jp-GpuMem-timelineLegend')!;
    expect(legend.textContent).toBe('AllocatedPrefillDecode');
    const swatches = Array.from(legend.querySelectorAll('.jp-GpuMem-bandSwatch'));
    expect(swatches.map(s => s.getAttribute('class'))).toEqual([
      'jp-GpuMem-swatch jp-GpuMem-bandSwatch jp-GpuMem-seg-5',
      'jp-GpuMem-swatch jp-GpuMem-bandSwatch jp-GpuMem-seg-14'
    ]);
  });

  it('puts the peak label in its own row above the plot, with a leader down to the point', () => {
    for (const name of [GPU, CPU]) {
      const timeline = timelineOf(name);
      const host = render(<TimelineChart timeline={timeline} units="GiB" label="cell" />);
      const plot = host.querySelector('.jp-GpuMem-timelinePlot')!;
      // The label's row comes before the y axis and the drawing: no curve runs under it.
      const row = plot.querySelector('.jp-GpuMem-timelinePeakRow')!;
      const label = row.querySelector('.jp-GpuMem-timelinePeakLabel') as HTMLElement;
      expect(label).not.toBeNull();
      const children = Array.from(plot.children);
      expect(children.indexOf(row)).toBeLessThan(
        children.indexOf(plot.querySelector('svg.jp-GpuMem-timelineSvg')!)
      );
      expect(plot.querySelector('svg .jp-GpuMem-timelinePeakLabel')).toBeNull();
      // The leader runs from above the plot area (y < 0) down to the dot, at its x.
      const dot = host.querySelector('circle.jp-GpuMem-timelinePeak')!;
      const leader = host.querySelector('line.jp-GpuMem-timelinePeakLeader')!;
      expect(leader.getAttribute('x1')).toBe(dot.getAttribute('cx'));
      expect(leader.getAttribute('x2')).toBe(dot.getAttribute('cx'));
      expect(parseFloat(leader.getAttribute('y1') ?? '')).toBeLessThan(0);
      expect(leader.getAttribute('y2')).toBe(dot.getAttribute('cy'));
      // The label starts at the leader's x, then is aligned to stay inside the plot.
      expect(label.style.left).toBe(dot.getAttribute('cx'));
    }
    const gpu = render(<TimelineChart timeline={gpuTimeline()} units="GiB" label="cell" />);
    // The GPU peak comes early (8% of the cell): the label runs to the right of it.
    expect(gpu.querySelector('.jp-GpuMem-timelinePeakLabel')?.className).toContain('jp-mod-start');
    const cpu = render(<TimelineChart timeline={timelineOf(CPU)} units="GiB" label="cell" />);
    // The CPU peak comes late (95%): the label ends at it.
    const cpuLabel = cpu.querySelector('.jp-GpuMem-timelinePeakLabel');
    expect(cpuLabel?.className).toContain('jp-mod-end');
    expect(cpuLabel?.textContent).toBe('peak 20.2 MiB at 57.4 ms');
  });

  it('aligns a label to stay inside, as the kernel\'s SVG does', () => {
    expect([0, 0.29, 0.3, 0.5, 0.7, 0.71, 1].map(labelAlign)).toEqual([
      'start',
      'start',
      'middle',
      'middle',
      'middle',
      'end',
      'end'
    ]);
  });

  it('draws nothing for fewer than two points', () => {
    const host = render(
      <TimelineChart
        timeline={{
          t_s: [0],
          allocated_bytes: [1],
          reserved_bytes: [1],
          bands: [],
          peak_t_s: 0,
          peak_bytes: 1
        }}
        units="GiB"
        label="cell"
      />
    );
    expect(host.querySelector('svg')).toBeNull();
  });

  it('renders a hostile phase name as text in the band tooltip', () => {
    const timeline = gpuTimeline();
    timeline.bands[0].phase = '<img src=x onerror=alert(1)>';
    const host = render(<TimelineChart timeline={timeline} units="GiB" label="cell" />);
    expect(host.querySelector('img')).toBeNull();
    const band = host.querySelector('rect.jp-GpuMem-band');
    expect(band?.getAttribute('data-phase')).toBe('other');
    expect(band?.textContent).toBe('<img src=x onerror=alert(1)>, step 0');
  });
});
