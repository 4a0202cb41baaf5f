import * as React from 'react';

import { fixture, HOSTILE, misaligned, render } from '../../__tests__/helpers';
import { parseReport, REPORT_MIME_TYPE } from '../../wire';
import {
  breakdownSegments,
  budgetWarning,
  mainDevice,
  rendererFactory,
  ReportView,
  schemaWarning,
  statusBadge
} from '../renderer';

describe('ReportView', () => {
  it('shows the numbers of the shared report fixture', () => {
    const host = render(<ReportView report={parseReport(fixture('report.json'))} units="GiB" />);
    const text = host.textContent ?? '';
    expect(text).toContain('%%gpumem train');
    expect(text).toContain('ok');
    expect(text).toContain('Peak allocated14.7 GiB');
    expect(text).toContain('Peak reserved15.5 GiB');
    expect(text).toContain('Cache13.2 GiB');
    expect(text).toContain('Wall time3.42 s');
    expect(text).toContain('cuda:0 · NVIDIA H100 80GB HBM3');
    expect(text).toContain('forward, step 2');
    // The breakdown is a stacked bar with one segment per non-empty category.
    const segments = host.querySelectorAll('.jp-GpuMem-stackedBar .jp-GpuMem-seg');
    expect(segments).toHaveLength(8);
    expect(text).toContain('Activations12.2 GiB · 83%');
  });

  it('uses decimal units when asked', () => {
    const host = render(<ReportView report={parseReport(fixture('report.json'))} units="GB" />);
    expect(host.textContent).toContain('Peak allocated15.8 GB');
  });

  it('explains a report without CUDA', () => {
    const report = parseReport({
      name: null,
      status: 'ok',
      wall_s: 0.002,
      cuda_available: false,
      notes: ['No CUDA device is present; the cell ran unchanged.'],
      devices: []
    });
    const host = render(<ReportView report={report} units="GiB" />);
    expect(host.textContent).toContain('No CUDA device was used by this cell.');
    expect(host.textContent).toContain('No CUDA device is present; the cell ran unchanged.');
    expect(host.querySelector('table')).toBeNull();
  });

  it('renders every kernel string as text, never as HTML', () => {
    const raw = fixture('report.json');
    raw.name = HOSTILE;
    raw.status = HOSTILE;
    raw.error = HOSTILE;
    raw.source = HOSTILE;
    raw.notes = [HOSTILE];
    raw.warnings = [HOSTILE];
    raw.devices[0].name = HOSTILE;
    raw.devices[0].device = HOSTILE;
    raw.devices[0].peak_phase = HOSTILE;
    raw.devices[0].breakdown[HOSTILE] = 1024;
    const host = render(<ReportView report={parseReport(raw)} units="GiB" />);
    expect(host.querySelector('img, script')).toBeNull();
    expect(host.querySelector('[onerror]')).toBeNull();
    const count = (host.textContent ?? '').split(HOSTILE).length - 1;
    expect(count).toBeGreaterThanOrEqual(9);
  });
});

describe('ReportView with the timeline, tensors, OOM and leak hints', () => {
  const GPU = 'report_gpu_training_step.json';

  it('shows every part of the report recorded on the GPU machine', () => {
    const host = render(<ReportView report={parseReport(fixture(GPU))} units="GiB" />);
    const text = host.textContent ?? '';
    expect(text).toContain('cuda:0 · NVIDIA H200');
    expect(text).toContain('Memory over the cell on cuda:0');
    expect(host.querySelectorAll('path.jp-GpuMem-series')).toHaveLength(2);
    expect(host.querySelectorAll('circle.jp-GpuMem-timelinePeak')).toHaveLength(1);
    expect(text).toContain('peak 782 MiB at 0.6 ms');
    expect(text).toContain('At the peak on cuda:0');
    expect(text).toContain('Tensors the cell left alive on cuda:0');
    expect(host.querySelectorAll('tr.jp-GpuMem-tensor')).toHaveLength(10);
    expect(text).toContain('Largest freed: 16 MiB from cell line 7');
    // No OOM and no leak hints in this recording.
    expect(host.querySelector('.jp-GpuMem-oom')).toBeNull();
    expect(host.querySelector('.jp-GpuMem-leaks')).toBeNull();
    // The sections come in a fixed order: timeline, breakdown, tensors.
    const order = Array.from(host.querySelectorAll('.jp-GpuMem-sectionTitle')).map(
      e => e.textContent
    );
    expect(order).toEqual([
      'Memory over the cell on cuda:0',
      'At the peak on cuda:0',
      'Tensors the cell left alive on cuda:0'
    ]);
  });

  it('shows an OOM section and leak hints when the report has them', () => {
    const raw = fixture(GPU);
    raw.status = 'oom';
    raw.devices[0].oom = {
      requested_bytes: 2 ** 30,
      breakdown: raw.devices[0].breakdown,
      dominant: 'temporary',
      advice: 'a smaller batch, or chunking the largest operation',
      largest: raw.devices[0].tensors.slice(0, 2)
    };
    raw.leak_hints = [
      {
        kind: 'traceback',
        bytes: 3 * 2 ** 20,
        message: 'The last traceback holds 3 MiB of tensors.',
        fix: 'Run `%gpumem free`.',
        where: ['sys.last_traceback']
      }
    ];
    const host = render(<ReportView report={parseReport(raw)} units="GiB" />);
    const text = host.textContent ?? '';
    expect(host.querySelector('.jp-GpuMem-status.jp-mod-bad')?.textContent).toBe('oom');
    expect(text).toContain('Out of memory on cuda:0, asking for 1 GiB');
    expect(text).toContain('Most of what was live: Temporaries (454 MiB)');
    expect(text).toContain('Try: a smaller batch, or chunking the largest operation');
    expect(host.querySelectorAll('.jp-GpuMem-oom tr.jp-GpuMem-tensor')).toHaveLength(2);
    expect(text).toContain('The last traceback holds 3 MiB of tensors.');
    expect(text).toContain('Fix: Run %gpumem free.');
    expect(host.querySelector('.jp-GpuMem-leakFix code')?.textContent).toBe('%gpumem free');
  });

  it('shows the CPU recording with one series, whole tensor names and a code-span hint', () => {
    const host = render(
      <ReportView report={parseReport(fixture('report_cpu_training_step.json'))} units="GiB" />
    );
    const text = host.textContent ?? '';
    expect(text).toContain('Memory over the cell on cpu');
    // On the CPU reserved is allocated: one line, and no "Reserved" in the legend.
    expect(
      Array.from(host.querySelectorAll('path.jp-GpuMem-series')).map(p =>
        p.getAttribute('data-series')
      )
    ).toEqual(['allocated']);
    expect(host.querySelector('.jp-GpuMem-timelineLegend')?.textContent).toBe(
      'AllocatedForwardBackwardOptimizer'
    );
    expect(text).toContain(
      "opt.state[model.transformer_encoder.0.feed_forward_intermediate_dense.weight]['exp_avg']"
    );
    expect(text).not.toContain('…');
    expect(text).toContain('Fix: Store loss.item() or loss.detach() instead');
    expect(text).not.toContain('`');
  });

  it('leaves the new sections out for the older fixture, which lacks their fields', () => {
    const host = render(<ReportView report={parseReport(fixture('report.json'))} units="GiB" />);
    expect(host.querySelector('.jp-GpuMem-timeline')).toBeNull();
    expect(host.querySelector('.jp-GpuMem-tensors')).toBeNull();
    expect(host.querySelector('.jp-GpuMem-oom')).toBeNull();
    expect(host.querySelector('.jp-GpuMem-leaks')).toBeNull();
    expect(host.querySelectorAll('.jp-GpuMem-stackedBar')).toHaveLength(1);
  });

  it('renders hostile tensor names, leak messages and phases as text, never as HTML', () => {
    const raw = fixture(GPU);
    const device = raw.devices[0];
    for (const t of device.tensors) {
      t.name = HOSTILE;
      t.line = HOSTILE;
    }
    device.tensors[0].dtype = HOSTILE;
    device.timeline.bands[0].phase = HOSTILE;
    device.peak_phase = HOSTILE;
    device.oom = {
      requested_bytes: 1,
      breakdown: { [HOSTILE]: 1 },
      dominant: HOSTILE,
      advice: HOSTILE,
      largest: [device.tensors[0]]
    };
    raw.leak_hints = [
      { kind: HOSTILE, bytes: 1, message: HOSTILE, fix: HOSTILE, where: [HOSTILE] }
    ];
    const before = document.querySelectorAll('img, script').length;
    const host = render(<ReportView report={parseReport(raw)} units="GiB" />);
    expect(host.querySelector('img, script, [onerror]')).toBeNull();
    expect(document.querySelectorAll('img, script').length).toBe(before);
    // Only the hint's own elements: message, kind, bytes, fix, its label, holders, one code.
    const leak = host.querySelector('.jp-GpuMem-leak');
    expect(leak?.querySelectorAll('*').length).toBe(7);
    const names = host.querySelectorAll('.jp-GpuMem-tensors td.jp-GpuMem-tensorName');
    expect(names).toHaveLength(10);
    for (const td of Array.from(names)) {
      expect(td.textContent).toBe(HOSTILE);
      expect(td.getAttribute('title')).toBe(HOSTILE);
    }
    expect(host.querySelector('.jp-GpuMem-leakMessage')?.textContent).toContain(HOSTILE);
  });
});

describe('ReportView across report schemas', () => {
  it('shows a generate call: a KV cache segment, prefill and decode bands', () => {
    const report = parseReport(fixture('report_gpu_generate.json'));
    expect(report.schema).toBe(3);
    const host = render(<ReportView report={report} units="GiB" />);
    const kv = host.querySelector('.jp-GpuMem-stackedBar .jp-GpuMem-seg-14');
    expect(kv).not.toBeNull();
    expect(kv?.getAttribute('title')).toMatch(/^KV cache: /);
    expect(host.querySelector('.jp-GpuMem-breakdown')?.textContent).toContain('KV cache');
    const legend = host.querySelector('.jp-GpuMem-timelineLegend')?.textContent ?? '';
    expect(legend).toContain('Prefill');
    expect(legend).toContain('Decode');
    expect(host.querySelector('.jp-GpuMem-messages.jp-mod-warning')).toBeNull();
    expect(host.querySelector('.jp-GpuMem-modules')).not.toBeNull();
  });

  it('still shows schema 1 reports, without a schema warning', () => {
    for (const name of ['report.json', 'report_gpu_training_step.json']) {
      const report = parseReport(fixture(name));
      expect(report.schema).toBe(1);
      const host = render(<ReportView report={report} units="GiB" />);
      expect(host.querySelectorAll('.jp-GpuMem-stackedBar .jp-GpuMem-seg').length).toBeGreaterThan(
        0
      );
      expect(host.textContent).not.toContain('schema');
    }
  });

  it('says when a report is newer than this extension reads, and shows it all the same', () => {
    const raw = fixture('report_gpu_generate.json');
    raw.schema = 4;
    raw.devices[0].breakdown.tensor_parallel_shards = 1024;
    const report = parseReport(raw);
    expect(schemaWarning(report)).toHaveLength(1);
    expect(schemaWarning(parseReport(fixture('report.json')))).toEqual([]);
    const host = render(<ReportView report={report} units="GiB" />);
    expect(host.querySelector('.jp-GpuMem-messages.jp-mod-warning')?.textContent).toContain(
      'this report has schema 4, newer than this extension reads (1, 2 and 3)'
    );
    expect(host.querySelector('.jp-GpuMem-breakdown')?.textContent).toContain(
      'tensor parallel shards'
    );
  });
});

describe('breakdownSegments', () => {
  it('keeps the category order and colour, unknown categories last and grey', () => {
    const segments = breakdownSegments({ zeta: 1, activations: 5, parameters: 2 });
    expect(segments.map(s => s.key)).toEqual(['parameters', 'activations', 'zeta']);
    expect(segments.map(s => s.label)).toEqual(['Parameters', 'Activations', 'zeta']);
    expect(segments.map(s => s.color)).toEqual([0, 4, 13]);
  });

  it('names the allocator slack and communication buffers in colours of their own, empty ones left out', () => {
    const segments = breakdownSegments({
      communication: 3,
      allocator_slack: 1,
      temporary: 2,
      inputs: 0
    });
    expect(segments.map(s => s.label)).toEqual([
      'Temporaries',
      'Allocator slack',
      'Communication buffers'
    ]);
    expect(segments.map(s => s.color)).toEqual([7, 11, 12]);
  });
});

describe('rendererFactory', () => {
  it('is preferred over text/html and safe for untrusted outputs', () => {
    expect(rendererFactory.mimeTypes).toEqual([REPORT_MIME_TYPE]);
    expect(rendererFactory.safe).toBe(true);
    // The html renderer's rank is 50; lower ranks win.
    expect(rendererFactory.defaultRank).toBeLessThan(50);
  });

  it('shows a plain message for malformed data', async () => {
    const renderer = rendererFactory.createRenderer({
      mimeType: REPORT_MIME_TYPE,
      sanitizer: { sanitize: (s: string) => s },
      resolver: null,
      linkHandler: null,
      latexTypesetter: null
    } as any);
    await renderer.renderModel({
      data: { [REPORT_MIME_TYPE]: HOSTILE },
      metadata: {},
      trusted: false,
      setData: () => undefined
    } as any);
    document.body.appendChild(renderer.node);
    const { act } = await import('react');
    await act(async () => {
      (renderer as any).onUpdateRequest();
    });
    expect(renderer.node.textContent).toContain('Cannot show this %%gpumem report');
    expect(renderer.node.querySelector('img')).toBeNull();
    renderer.dispose();
  });
});

describe('main device and budget from the kernel', () => {
  const device = (name: string, peak: number, before: number) => ({
    device: name,
    index: Number(name.slice(-1)),
    name: 'GPU',
    peak_allocated_bytes: peak,
    allocated_before_bytes: before
  });
  const twoDevices = {
    name: null,
    status: 'ok',
    wall_s: 1,
    cuda_available: true,
    notes: [],
    warnings: [],
    // cuda:0 has the larger peak, cuda:1 the larger rise: the kernel named cuda:1.
    devices: [device('cuda:0', 8 * 2 ** 30, 7 * 2 ** 30), device('cuda:1', 6 * 2 ** 30, 0)],
    main_device: 'cuda:1',
    budget_bytes: 5 * 2 ** 30,
    over_budget: true
  };

  it('headlines the device the kernel named, not one it picks itself', () => {
    const report = parseReport(twoDevices);
    expect(mainDevice(report)?.device).toBe('cuda:1');
    const host = render(<ReportView report={report} units="GiB" />);
    expect(host.textContent).toContain('Peak allocated6 GiB');
  });

  it('falls back to the first device in reports saved before the kernel named one', () => {
    const { main_device, over_budget, ...old } = twoDevices;
    const report = parseReport(old);
    expect(mainDevice(report)?.device).toBe('cuda:0');
    expect(report.over_budget).toBe(false);
    expect(budgetWarning(report, mainDevice(report), 'GiB')).toEqual([]);
  });

  it('shows a badge that agrees with the budget: never "ok" beside an exceeded budget', () => {
    const over = parseReport(twoDevices);
    expect(statusBadge(over)).toEqual({ text: 'over budget', bad: true });
    const host = render(<ReportView report={over} units="GiB" />);
    const badge = host.querySelector('.jp-GpuMem-reportHeader .jp-GpuMem-status')!;
    expect(badge.textContent).toBe('over budget');
    expect(badge.classList.contains('jp-mod-bad')).toBe(true);
    expect(host.querySelector('.jp-GpuMem-metric.jp-mod-over')?.textContent).toContain(
      '(exceeded)'
    );
    const within = parseReport({ ...twoDevices, over_budget: false });
    expect(statusBadge(within)).toEqual({ text: 'ok', bad: false });
    const failed = parseReport({ ...twoDevices, status: 'oom' });
    expect(statusBadge(failed)).toEqual({ text: 'oom', bad: true }); // the failure comes first
  });

  it('words the budget warning in the chosen units', () => {
    const report = parseReport(twoDevices);
    expect(budgetWarning(report, mainDevice(report), 'GB')).toEqual([
      'peak 6.44 GB on cuda:1 exceeds the budget of 5.37 GB by 1.07 GB'
    ]);
    const host = render(<ReportView report={report} units="GiB" />);
    expect(host.textContent).toContain('peak 6 GiB on cuda:1 exceeds the budget of 5 GiB by 1 GiB');
    expect(host.textContent).toContain('(exceeded)');
  });
});

describe('the device table', () => {
  it('puts each heading over its own figures: right-aligned over right-aligned', () => {
    for (const name of ['report.json', 'report_cpu_training_step.json']) {
      const host = render(<ReportView report={parseReport(fixture(name))} units="GiB" />);
      const table = host.querySelector('.jp-GpuMem-reportTable')!;
      expect(table.querySelectorAll('thead th').length).toBe(
        table.querySelectorAll('tbody tr:first-child td').length
      );
      expect(misaligned(table)).toEqual([]);
    }
  });
});

describe('ReportView of CPU tensors', () => {
  const CPU = 'report_cpu_training_step.json';
  const WHY =
    'the CPU has no caching allocator, so nothing is reserved beyond what its tensors hold';

  it('shows no reserved or cache figures: the CPU has no caching allocator', () => {
    const host = render(<ReportView report={parseReport(fixture(CPU))} units="GiB" />);
    const metrics = Array.from(host.querySelectorAll('.jp-GpuMem-metricLabel')).map(
      e => e.textContent
    );
    expect(metrics).toEqual(['Peak allocated', 'Wall time']);
    const heads = Array.from(host.querySelectorAll('.jp-GpuMem-reportTable th')).map(
      e => e.textContent
    );
    expect(heads).toEqual(['Device', 'Peak allocated', 'Δ allocated', 'Peak at']);
    expect(host.textContent).not.toContain('Peak reserved');
    expect(host.textContent).not.toContain('Cache');
  });

  it('says "CPU tensors" for how the figures were measured, not the source\'s name', () => {
    const host = render(<ReportView report={parseReport(fixture(CPU))} units="GiB" />);
    const meta = Array.from(
      host.querySelectorAll('.jp-GpuMem-reportHeader .jp-GpuMem-reportMeta')
    );
    expect(meta.map(e => e.textContent)).toEqual(['62.6 ms', 'CPU tensors']);
    expect(meta[1].getAttribute('title')).toBe(
      'no CUDA device: the memory of the CPU tensors the cell made'
    );
    expect(host.textContent).not.toContain('cpu-dispatch');
    const gpu = render(<ReportView report={parseReport(fixture('report.json'))} units="GiB" />);
    expect(gpu.querySelector('.jp-GpuMem-reportHeader')?.textContent).toContain('allocator trace');
    const none = parseReport({ ...fixture('report.json'), source: 'none' });
    const bare = render(<ReportView report={none} units="GiB" />);
    expect(bare.querySelectorAll('.jp-GpuMem-reportHeader .jp-GpuMem-reportMeta')).toHaveLength(1);
  });

  it('gives a CPU row beside a GPU a dash that says why', () => {
    const raw = fixture('report.json');
    raw.devices.push({ ...fixture(CPU).devices[0] });
    const host = render(<ReportView report={parseReport(raw)} units="GiB" />);
    const rows = Array.from(host.querySelectorAll('.jp-GpuMem-reportTable tbody tr')).map(tr =>
      Array.from(tr.querySelectorAll('td')).map(td => td.textContent)
    );
    expect(rows[0].slice(2, 4)).toEqual(['15.5 GiB', '13.2 GiB']);
    expect(rows[1].slice(2, 4)).toEqual(['—', '—']);
    const dashes = host.querySelectorAll('.jp-GpuMem-reportTable td.jp-GpuMem-noCache');
    expect(Array.from(dashes).map(td => td.getAttribute('title'))).toEqual([WHY, WHY]);
    // The GPU is the main device: its metrics stay.
    expect(host.textContent).toContain('Peak reserved15.5 GiB');
  });
});
