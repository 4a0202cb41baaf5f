import * as React from 'react';

import { breakdownSegments, rendererFactory, ReportView } from '../renderer';
import { parseReport, REPORT_MIME_TYPE } from '../types';
import { fixture, HOSTILE, render } from './helpers';

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

describe('breakdownSegments', () => {
  it('keeps the category order and colour, unknown categories last and grey', () => {
    const segments = breakdownSegments({ zeta: 1, activations: 5, parameters: 2 });
    expect(segments.map(s => s.key)).toEqual(['parameters', 'activations', 'zeta']);
    expect(segments.map(s => s.label)).toEqual(['Parameters', 'Activations', 'zeta']);
    expect(segments.map(s => s.color)).toEqual([0, 4, 11]);
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
