import * as React from 'react';
import { act } from 'react';

import { click, fixture, HOSTILE, misaligned, render } from '../../__tests__/helpers';
import { parseReport } from '../../wire';
import { RankSection, worstRank } from '../ranks';
import { ReportView } from '../renderer';

/** The two-rank report recorded on two H200s (a forked DDP job on NCCL). */
function twoRanks(): any {
  return fixture('report_two_ranks.json');
}

function details(host: HTMLElement): string {
  return host.querySelector('.jp-GpuMem-rankDetails')?.textContent ?? '';
}

function select(host: HTMLElement, index: number): void {
  const picker = host.querySelector('.jp-GpuMem-rankSelect') as HTMLSelectElement;
  act(() => {
    picker.value = String(index);
    picker.dispatchEvent(new Event('change', { bubbles: true }));
  });
}

describe('ranks', () => {
  it('parses the ranks of the fixture, each a report with its rank and pid', () => {
    const report = parseReport(twoRanks());
    expect(report.ranks?.map(r => [r.rank, r.pid, r.main_device])).toEqual([
      [0, 688, 'cuda:0'],
      [1, 689, 'cuda:1']
    ]);
    expect(report.worst_rank).toBe(1);
    expect(worstRank(report)?.rank).toBe(1);
  });

  it('draws one bar per rank on one scale and marks the worst', () => {
    const report = parseReport(twoRanks());
    const host = render(<ReportView report={report} units="GiB" />);
    const rows = host.querySelectorAll('.jp-GpuMem-rankRow');
    expect(rows).toHaveLength(2);
    expect(rows[1].classList.contains('jp-mod-worst')).toBe(true);
    expect(rows[0].classList.contains('jp-mod-worst')).toBe(false);
    expect(rows[1].textContent).toContain('rank 1 worst');
    expect(rows[1].textContent).toContain('309 MiB');
    expect(rows[0].textContent).toContain('291 MiB');
    const fills = Array.from(host.querySelectorAll('.jp-GpuMem-rankRow .jp-GpuMem-gaugeFill'));
    expect(fills.map(f => (f as HTMLElement).style.width)).toEqual(['94.2%', '100.0%']);
    expect(host.textContent).toContain('2 worker processes; the worst is rank 1, peak 309 MiB');
  });

  it('puts each heading of the ranks table over its own figures', () => {
    const host = render(
      <RankSection report={parseReport(twoRanks())} units="GiB" renderRank={() => <div />} />
    );
    expect(misaligned(host.querySelector('.jp-GpuMem-rankTable')!)).toEqual([]);
  });

  it('shows the worst rank first, and another rank when selected or clicked', () => {
    const report = parseReport(twoRanks());
    const host = render(
      <RankSection
        report={report}
        units="GiB"
        renderRank={r => <ReportView report={r} units="GiB" />}
      />
    );
    expect(details(host)).toContain('%%gpumem rank 1');
    expect(details(host)).toContain('At the peak on cuda:1');
    select(host, 0);
    expect(details(host)).toContain('%%gpumem rank 0');
    expect(details(host)).toContain('cuda:0 · NVIDIA H200');
    click(host.querySelectorAll('.jp-GpuMem-rankRow')[1]);
    expect(details(host)).toContain('%%gpumem rank 1');
  });

  it('shows a dash with its reason for the reserved bytes of a rank on the CPU', () => {
    const raw = twoRanks();
    const cpu = fixture('report_cpu_training_step.json').devices[0];
    raw.ranks[0].devices = [cpu];
    raw.ranks[0].main_device = 'cpu';
    const host = render(<ReportView report={parseReport(raw)} units="GiB" />);
    const rows = host.querySelectorAll('.jp-GpuMem-rankRow');
    const reserved = (row: Element) => row.querySelectorAll('td.jp-GpuMem-num')[1];
    expect(reserved(rows[0]).textContent).toBe('—');
    expect(reserved(rows[0]).getAttribute('title')).toBe(
      'the CPU has no caching allocator, so nothing is reserved beyond what its tensors hold'
    );
    expect(reserved(rows[1]).textContent).toMatch(/MiB$/);
  });

  it('gives a rank that died without a report a row that says how it ended', () => {
    const raw = twoRanks();
    raw.ranks.push({
      name: 'rank 2',
      status: 'error',
      error: 'no report: killed by SIGKILL',
      wall_s: 0,
      cuda_available: false,
      devices: [],
      rank: 2,
      pid: 690
    });
    const host = render(<ReportView report={parseReport(raw)} units="GiB" />);
    const rows = host.querySelectorAll('.jp-GpuMem-rankRow');
    expect(rows).toHaveLength(3);
    expect(rows[2].textContent).toBe('rank 2690–no report: killed by SIGKILL');
    expect(worstRank(parseReport(raw))?.rank).toBe(1);
  });

  it('renders the ranks strings as text, never as HTML', () => {
    const raw = twoRanks();
    raw.ranks[0].error = HOSTILE;
    raw.ranks[0].status = 'error';
    raw.ranks[0].name = HOSTILE;
    const host = render(<ReportView report={parseReport(raw)} units="GiB" />);
    expect(host.querySelector('img')).toBeNull();
    expect(host.textContent).toContain(HOSTILE);
  });

  it('reports without ranks show no rank section', () => {
    const host = render(<ReportView report={parseReport(fixture('report.json'))} units="GiB" />);
    expect(host.querySelector('.jp-GpuMem-ranks')).toBeNull();
  });
});
