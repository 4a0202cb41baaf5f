import * as fs from 'fs';
import * as path from 'path';
import * as React from 'react';

import { click, fixture, HOSTILE, render } from '../../__tests__/helpers';
import { collectReports, IReportEntry } from '../../notebook';
import { IKernelHost, parseSample, REPORT_MIME_TYPE } from '../../wire';
import { IPoint } from '../model';
import { ISidebarProps, largestModuleOf, peakOf, SidebarView } from '../sidebar';
import { statusText } from '../statusbar';

function props(overrides: Partial<ISidebarProps> = {}): ISidebarProps {
  const sample = parseSample(fixture('sample.json'));
  const series = (index: number): IPoint[] =>
    [0, 10, 20].map(dt => ({
      time: sample.time - 20 + dt,
      used_bytes: sample.devices[index].memory_used_bytes
    }));
  return {
    sample,
    error: null,
    series,
    window_s: 300,
    kernelPids: new Set(),
    kernelProcesses: null,
    kernelId: null,
    kernelHost: null,
    notebookTitle: null,
    reports: [],
    onReveal: () => undefined,
    units: 'GiB',
    ...overrides
  };
}

const HOST: IKernelHost = {
  kernel_id: 'k1',
  pid: 4321,
  pids: [4321, 4330, 4331],
  rss_bytes: 300 * 2 ** 20,
  host_total_bytes: 16 * 2 ** 30,
  host_available_bytes: 9 * 2 ** 30,
  reason: null
};

/** A report of CPU tensors, as the kernel sends it without CUDA (8 MiB peak). */
function cpuReport(name: string, execution_count: number): any {
  return {
    schema: 1,
    id: name,
    name,
    execution_count,
    started_at: execution_count,
    wall_s: 2.27,
    status: 'ok',
    cuda_available: false,
    source: 'cpu-dispatch',
    notes: ['No CUDA device is present: the cell ran unchanged and no GPU memory was measured.'],
    warnings: [],
    leak_hints: [],
    devices: [
      {
        device: 'cpu',
        index: -1,
        name: 'CPU tensors',
        peak_allocated_bytes: 8 * 2 ** 20,
        peak_reserved_bytes: 8 * 2 ** 20,
        cache_bytes: 0,
        breakdown: null,
        peak_phase: 'other',
        peak_step: 0,
        timeline: null,
        tensors: [],
        oom: null
      }
    ]
  };
}

function noGpuSample(reason: string) {
  return { ...parseSample(fixture('sample.json')), available: false, reason, devices: [] };
}

function reportCell(id: string, report: any) {
  return { id, outputs: [{ data: { [REPORT_MIME_TYPE]: report, 'text/plain': 'x' } }] };
}

describe('SidebarView', () => {
  it('shows a card per device with gauge, sparkline and processes', () => {
    const host = render(<SidebarView {...props()} />);
    const cards = host.querySelectorAll('.jp-GpuMem-card');
    expect(cards).toHaveLength(2);
    const h100 = cards[0].textContent ?? '';
    expect(h100).toContain('GPU 0');
    expect(h100).toContain('NVIDIA H100 80GB HBM3');
    expect(h100).toContain('16.5/79.6 GiB (21%)');
    expect(h100).toContain('util 87%');
    expect(h100).toContain('48211');
    expect(cards[0].querySelectorAll('.jp-GpuMem-sparkLine')).toHaveLength(1);
    expect(host.textContent).toContain('driver 550.54.15');
    // MIG: no utilisation, with NVML's reason; process memory unknown.
    const mig = cards[1].textContent ?? '';
    expect(mig).toContain('MIG of GPU 1');
    expect(mig).toContain('util – (not supported)');
  });

  it("highlights the active kernel's processes", () => {
    const host = render(<SidebarView {...props({ kernelPids: new Set([50377]) })} />);
    const rows = host.querySelectorAll('.jp-GpuMem-process.jp-mod-kernel');
    expect(rows).toHaveLength(1);
    expect(rows[0].textContent).toContain('50377');
    expect(rows[0].textContent).toContain('this notebook');
  });

  it('renders process commands as text, never as HTML', () => {
    const p = props();
    p.sample!.devices[0].processes.push({ pid: 666, command: HOSTILE, memory_bytes: 1 });
    p.sample!.devices[0].name = HOSTILE;
    const host = render(<SidebarView {...p} />);
    expect(host.querySelector('img, script, [onerror]')).toBeNull();
    expect(host.textContent).toContain(HOSTILE);
  });

  it('shows the typed reason when NVML is unavailable', () => {
    const p = props();
    p.sample = { ...p.sample!, available: false, reason: 'driver not loaded', devices: [] };
    const host = render(<SidebarView {...p} />);
    expect(host.querySelector('.jp-GpuMem-unavailable')?.textContent).toBe(
      'NVML unavailableDriver not loaded'.replace('Driver', 'driver')
    );
    expect(host.querySelector('.jp-GpuMem-card')).toBeNull();
  });

  it('without a GPU, says why and what to do, and shows the kernel and its CPU reports', () => {
    const reports = collectReports([reportCell('a', cpuReport('cpu', 3))]);
    const host = render(
      <SidebarView
        {...props({
          sample: noGpuSample('library not found'),
          kernelId: 'k1',
          kernelHost: HOST,
          notebookTitle: 'Untitled.ipynb',
          reports
        })}
      />
    );
    expect(host.querySelector('.jp-GpuMem-noGpuHelp')?.textContent).toBe(
      'No NVIDIA GPU is visible to this server (NVML: library not found). Reports of CPU ' +
        'tensors still appear below; run on a machine with an NVIDIA driver for live GPU gauges.'
    );
    const section = host.querySelector('.jp-GpuMem-host');
    expect(section?.querySelector('[role=meter]')?.getAttribute('aria-valuetext')).toBe(
      '300 MiB of 16 GiB (2%)'
    );
    expect(section?.querySelector('.jp-GpuMem-hostDetail')?.textContent).toBe(
      'pid 4321 and 2 child processes · 9 GiB available on this machine'
    );
    const item = host.querySelector('.jp-GpuMem-reportItem')?.textContent ?? '';
    expect(item).toContain('[3] cpu');
    expect(item).toContain('peak 8 MiB (CPU) · 2.27 s');
  });

  it("lists the peak of the device the kernel named, the first device's in older reports", () => {
    const raw = fixture('report.json');
    const gpu = raw.devices[0];
    // cuda:1 has the larger peak, but the cell's rise above its start was on cuda:0.
    raw.devices = [gpu, { ...gpu, device: 'cuda:1', index: 1, peak_allocated_bytes: 20 * 2 ** 30 }];
    const [named] = collectReports([reportCell('a', { ...raw, main_device: 'cuda:0' })]);
    expect(peakOf(named)).toEqual({ bytes: gpu.peak_allocated_bytes, cpu: false });
    const [second] = collectReports([reportCell('b', { ...raw, main_device: 'cuda:1' })]);
    expect(peakOf(second).bytes).toBe(20 * 2 ** 30);
    const { main_device, ...old } = raw;
    expect(main_device).toBe('cuda:0');
    const [older] = collectReports([reportCell('c', old)]);
    expect(peakOf(older).bytes).toBe(gpu.peak_allocated_bytes);
    expect(peakOf(collectReports([reportCell('d', cpuReport('cpu', 3))])[0])).toEqual({
      bytes: 8 * 2 ** 20,
      cpu: true
    });
  });

  it("says what it knows of the kernel's host memory, and why not", () => {
    const unknown = { ...HOST, pid: null, pids: [], rss_bytes: null, reason: 'no /proc on this platform' };
    const cases: Array<[Partial<ISidebarProps>, string | null]> = [
      [{ notebookTitle: null }, null],
      [{ notebookTitle: 'a.ipynb' }, 'This notebook has no running kernel.'],
      [{ notebookTitle: 'a.ipynb', kernelId: 'k1' }, "Reading the kernel's memory…"],
      [
        { notebookTitle: 'a.ipynb', kernelId: 'k1', kernelHost: unknown },
        'Host memory unknown: no /proc on this platform'
      ]
    ];
    for (const [overrides, text] of cases) {
      const host = render(<SidebarView {...props({ sample: noGpuSample('library not found'), ...overrides })} />);
      const section = host.querySelector('.jp-GpuMem-host');
      if (text === null) {
        expect(section).toBeNull();
      } else {
        expect(section?.textContent).toBe(`Kernel host memory (RSS)${text}`);
      }
    }
  });

  it('keeps "Reading the GPUs" while the server sampler starts', () => {
    const host = render(<SidebarView {...props({ sample: noGpuSample('sampler starting') })} />);
    expect(host.querySelector('.jp-GpuMem-noGpu')).toBeNull();
    expect(host.textContent).toContain('Reading the GPUs…');
  });

  it('says when the server cannot be reached', () => {
    const host = render(<SidebarView {...props({ sample: null, error: '502 Bad Gateway' })} />);
    expect(host.querySelector('[role=alert]')?.textContent).toContain('502 Bad Gateway');
  });

  it('lists the reports of the notebook newest first and reveals one on click', () => {
    const older = { ...fixture('report.json'), name: 'older', started_at: 100 };
    const newer = { ...fixture('report.json'), name: HOSTILE, started_at: 200, status: 'oom' };
    const reports = collectReports([reportCell('a', older), reportCell('b', newer)]);
    const onReveal = jest.fn();
    const host = render(
      <SidebarView {...props({ notebookTitle: 'train.ipynb', reports, onReveal })} />
    );
    const items = host.querySelectorAll('.jp-GpuMem-reportItem');
    expect(items).toHaveLength(2);
    expect(items[0].textContent).toContain(HOSTILE);
    expect(items[0].textContent).toContain('oom');
    expect(items[1].textContent).toContain('[7] older');
    expect(items[1].textContent).toContain('peak 14.7 GiB · 3.42 s');
    expect(host.querySelector('img')).toBeNull();
    click(items[1]);
    expect(onReveal).toHaveBeenCalledTimes(1);
    expect((onReveal.mock.calls[0][0] as IReportEntry).cellId).toBe('a');
  });

  it("links a report to its largest module, and reveals that module on click", () => {
    const gpt = fixture('report_cpu_gpt_step.json');
    const reports = collectReports([
      reportCell('old', fixture('report.json')),
      reportCell('gpt', gpt)
    ]);
    const onReveal = jest.fn();
    const host = render(
      <SidebarView {...props({ notebookTitle: 'gpt.ipynb', reports, onReveal })} />
    );
    const links = host.querySelectorAll('.jp-GpuMem-reportModule');
    // Only the schema 3 report has modules.
    expect(links).toHaveLength(1);
    expect(links[0].textContent).toBe('largest:transformer.h.0.mlp.act8 MiB');
    expect(largestModuleOf(reports[0])).toEqual({
      device: 'cpu',
      path: 'transformer.h.0.mlp.act',
      bytes: 8388608
    });
    expect(largestModuleOf(reports[1])).toBeNull();
    click(links[0]);
    expect(onReveal).toHaveBeenCalledTimes(1);
    const [entry, module] = onReveal.mock.calls[0];
    expect((entry as IReportEntry).cellId).toBe('gpt');
    expect(module).toEqual({ device: 'cpu', path: 'transformer.h.0.mlp.act' });
  });

  it('names a largest module that is an index as model.2, and reveals the module 2', () => {
    const gpt = fixture('report_cpu_gpt_step.json');
    gpt.devices[0].largest_module = { path: '2', bytes: 16 * 2 ** 20 };
    const reports = collectReports([reportCell('seq', gpt)]);
    const onReveal = jest.fn();
    const host = render(
      <SidebarView {...props({ notebookTitle: 'seq.ipynb', reports, onReveal })} />
    );
    const link = host.querySelector('.jp-GpuMem-reportModule')!;
    expect(link.textContent).toBe('largest:model.216 MiB');
    expect(link.getAttribute('title')).toBe("Show model.2 in this report's modules");
    click(link);
    expect(onReveal.mock.calls[0][1]).toEqual({ device: 'cpu', path: '2' });
  });

  it("keeps a report's largest module inside its card, long names ellipsized", () => {
    const gpt = fixture('report_cpu_gpt_step.json');
    gpt.devices[0].largest_module.path = `transformer.${'very_long_module_name.'.repeat(8)}act`;
    const reports = collectReports([reportCell('gpt', gpt)]);
    const host = render(<SidebarView {...props({ notebookTitle: 'gpt.ipynb', reports })} />);
    // One card (the list item holds the border) around the cell's button and the module's.
    const card = host.querySelector('.jp-GpuMem-reportList > li')!;
    expect(card.classList.contains('jp-GpuMem-reportCard')).toBe(true);
    expect(Array.from(card.children).map(c => c.className)).toEqual([
      'jp-GpuMem-reportItem',
      'jp-GpuMem-reportModule'
    ]);
    // jsdom lays nothing out: the rules that keep the row inside the card are read instead.
    const css = fs.readFileSync(
      path.resolve(__dirname, '..', '..', '..', 'style', 'base.css'),
      'utf-8'
    );
    const rule = (selector: string): string => {
      const escaped = selector.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
      return new RegExp(`(^|\\n)${escaped} \\{([^}]*)\\}`).exec(css)?.[2] ?? '';
    };
    const cardRule = rule('.jp-GpuMem-reportCard');
    expect(cardRule).toContain('border: var(--jp-border-width) solid var(--jp-border-color2);');
    expect(cardRule).toContain('overflow: hidden;');
    for (const button of ['.jp-GpuMem-reportItem', '.jp-GpuMem-reportModule']) {
      const r = rule(button);
      const fits = ['box-sizing: border-box;', 'width: 100%;', 'min-width: 0;', 'margin: 0;'];
      for (const decl of [...fits, 'border: none;']) {
        expect(r).toContain(decl);
      }
    }
    for (const text of ['.jp-GpuMem-reportModulePath', '.jp-GpuMem-reportItemName']) {
      const r = rule(text);
      for (const decl of ['min-width: 0;', 'overflow: hidden;', 'text-overflow: ellipsis;']) {
        expect(r).toContain(decl);
      }
      expect(r).toContain('white-space: nowrap;');
    }
    expect(rule('.jp-GpuMem-reportModuleLabel')).toContain('flex: 0 0 auto;');
    expect(rule('.jp-GpuMem-reportModuleBytes')).toContain('flex: 0 0 auto;');
  });

  it('asks for a notebook when none is open', () => {
    const host = render(<SidebarView {...props()} />);
    expect(host.textContent).toContain('Open a notebook to see its reports.');
  });
});

describe('collectReports', () => {
  it('orders by start time, then execution count, then position', () => {
    const base = fixture('report.json');
    const cells = [
      reportCell('a', { ...base, started_at: null, execution_count: 3 }),
      reportCell('b', { ...base, started_at: null, execution_count: 9 }),
      { id: 'c', outputs: [{ data: { 'text/plain': 'no report' } }] },
      reportCell('d', { ...base, started_at: null, execution_count: null })
    ];
    expect(collectReports(cells).map(e => e.cellId)).toEqual(['b', 'a', 'd']);
    expect(collectReports(cells).map(e => e.cellIndex)).toEqual([1, 0, 3]);
  });

  it('skips malformed reports', () => {
    jest.spyOn(console, 'warn').mockImplementation(() => undefined);
    const cells = [reportCell('a', 'not a report'), reportCell('b', fixture('report.json'))];
    expect(collectReports(cells).map(e => e.cellId)).toEqual(['b']);
  });
});

describe('statusText', () => {
  it('shows the busiest GPU', () => {
    const sample = parseSample(fixture('sample.json'));
    expect(statusText(sample, null, 'GiB').text).toBe('GPU 0: 16.5/79.6 GiB');
    expect(statusText(sample, null, 'GB').text).toBe('GPU 0: 17.7/85.5 GB');
  });

  it('says why there is nothing to show', () => {
    expect(statusText(null, null, 'GiB').text).toBe('GPU: …');
    expect(statusText(null, 'boom', 'GiB').text).toBe('GPU: offline');
    const sample = { ...parseSample(fixture('sample.json')), available: false, reason: 'no permission' };
    const status = statusText(sample, null, 'GiB');
    expect(status.text).toBe('GPU: n/a');
    expect(status.title).toContain('This server may not read the GPUs (NVML: no permission)');
  });

  it("shows the kernel's host memory when there is no GPU", () => {
    const status = statusText(noGpuSample('library not found'), null, 'GiB', HOST);
    expect(status.text).toBe('GPU: n/a · kernel 300 MiB');
    expect(status.title).toContain('No NVIDIA GPU is visible to this server');
    expect(status.title).toContain("This notebook's kernel holds 300 MiB of host memory (RSS).");
    expect(statusText(noGpuSample('library not found'), null, 'GB', HOST).text).toBe(
      'GPU: n/a · kernel 315 MB'
    );
    // With a GPU, the GPU comes first.
    expect(statusText(parseSample(fixture('sample.json')), null, 'GiB', HOST).text).toBe(
      'GPU 0: 16.5/79.6 GiB'
    );
  });
});
