/**
 * A `%%gpumem` cell that forked a two-rank DDP job on two H200s
 * (tests/fixtures/report_two_ranks.json): one bar per rank on one scale, the worst rank
 * marked, and a selector that shows one rank's own report in full.
 */
import { expect, test } from '@jupyterlab/galata';
import { fixture, notebook, openNotebook, reportCell } from './notebooks';
import { screenshotPath } from './screenshots';

function ranksNotebook(): string {
  return notebook([
    reportCell(
      'ddp',
      "%%gpumem --name ddp\nmp.start_processes(ddp, args=(2,), nprocs=2, start_method='fork')",
      fixture('report_two_ranks.json')
    )
  ]);
}

test('a two-rank report shows both ranks, the worst marked, and each rank in detail', async ({
  page,
  tmpPath
}) => {
  const name = 'two-ranks.ipynb';
  await openNotebook(page, tmpPath, name, ranksNotebook());

  const section = page.locator('.jp-Notebook .jp-GpuMem-ranks');
  await expect(section).toHaveCount(1);
  await expect(section.locator('.jp-GpuMem-sectionTitle').first()).toHaveText(
    '2 worker processes; the worst is rank 1, peak 309 MiB'
  );
  const rows = section.locator('tr.jp-GpuMem-rankRow');
  await expect(rows).toHaveCount(2);
  await expect(rows.nth(0)).toContainText('rank 0');
  await expect(rows.nth(0)).toContainText('cuda:0');
  await expect(rows.nth(0)).toContainText('291 MiB');
  await expect(rows.nth(1)).toContainText('rank 1');
  await expect(rows.nth(1)).toContainText('cuda:1');
  await expect(rows.nth(1)).toContainText('309 MiB');
  await expect(rows.nth(1)).toHaveClass(/jp-mod-worst/);
  await expect(rows.nth(0)).not.toHaveClass(/jp-mod-worst/);
  await expect(section.locator('.jp-GpuMem-worstMark')).toHaveCount(1);

  // One bar per rank on one scale: the worst rank's is full, rank 0's a little shorter.
  const bars = section.locator('tr.jp-GpuMem-rankRow .jp-GpuMem-gaugeTrack');
  const full = await bars.nth(1).locator('.jp-GpuMem-gaugeFill').boundingBox();
  const track = await bars.nth(1).boundingBox();
  const shorter = await bars.nth(0).locator('.jp-GpuMem-gaugeFill').boundingBox();
  expect(Math.abs(full!.width - track!.width)).toBeLessThan(1.5);
  expect(shorter!.width / full!.width).toBeCloseTo(0.942, 2);

  // The worst rank is shown first; the selector shows the other one.
  const details = section.locator('.jp-GpuMem-rankDetails');
  await expect(details).toContainText('%%gpumem rank 1');
  await expect(details).toContainText('At the peak on cuda:1');
  await expect(details.locator('svg.jp-GpuMem-timelineSvg')).toHaveCount(1);
  await section
    .locator('select.jp-GpuMem-rankSelect')
    .selectOption({ label: 'rank 0 · pid 688' });
  await expect(details).toContainText('%%gpumem rank 0');
  await expect(details).toContainText('At the peak on cuda:0');

  await page.sidebar.close('left');
  await page.setViewportSize({ width: 1440, height: 1400 });
  const view = page.locator('.jp-Notebook .jp-GpuMem-reportView').first();
  await section.locator('select.jp-GpuMem-rankSelect').selectOption({ index: 1 });
  for (const theme of ['light', 'dark'] as const) {
    if (theme === 'dark') {
      await page.theme.setDarkTheme();
      await expect(section).toHaveCount(1);
    }
    await view.scrollIntoViewIfNeeded();
    await view.screenshot({ path: screenshotPath(`report-ranks-${theme}.png`) });
  }
  await page.theme.setLightTheme();
});
