/**
 * UI tests of the live sidebar against a running kernel: `%%gpumem` cells run in
 * a new notebook (the CPU path, torch on the CPU) and the sidebar's report list
 * follows their outputs without reopening the notebook; and the panel without a
 * GPU, on the second server of no_gpu_server.ts, whose NVML stand-in fails to
 * start ("library not found").
 */
import { expect, IJupyterLabPageFixture, test } from '@jupyterlab/galata';
import { Locator } from '@playwright/test';

import { useNoGpuServer } from './no_gpu_server';
import { screenshotPath } from './screenshots';

const SIDEBAR_ID = 'jupyter-gpumem:sidebar';
const STATUS = '[id="jupyter-gpumem:status"]';

const SETUP = '%load_ext jupyter_gpumem\nimport torch';
/** Two 4 MiB tensors alive at once: an 8 MiB peak of CPU tensor memory, run after run. */
const CPU_CELL = [
  '%%gpumem --name cpu-tensors',
  'a = torch.ones(1024, 1024)',
  'b = a * 2',
  'del a, b'
].join('\n');
const SECOND_CELL = '%%gpumem --name second\nc = torch.zeros(256, 1024)';

const EMPTY_LIST = 'No %%gpumem reports in this notebook yet.';

/** A report item's execution count, name and peak, e.g. "[2] cpu-tensors … peak 8 MiB (CPU)". */
function item(name: string, peak: string): RegExp {
  return new RegExp(`^\\[(\\d+)\\] ${name}ok.*peak ${peak.replace(/[()]/g, '\\$&')} · `);
}

/** The execution count a report item shows; -1 while there is none. */
async function countOf(locator: Locator): Promise<number> {
  const text = await locator.textContent({ timeout: 1000 }).catch(() => null);
  const match = /^\[(\d+)\]/.exec(text ?? '');
  return match ? Number(match[1]) : -1;
}

async function openSidebar(page: IJupyterLabPageFixture): Promise<void> {
  await page.sidebar.openTab(SIDEBAR_ID);
  await page.sidebar.setWidth(400, 'right');
  await expect(page.locator('.jp-GpuMem-sidebarBody')).toBeVisible();
}

async function shot(page: IJupyterLabPageFixture, name: string): Promise<void> {
  await page.sidebar.close('left');
  await page.screenshot({ path: screenshotPath(`${name}.png`) });
}

/** A new notebook with the setup cell and the measured cell, not yet run. */
async function newNotebook(page: IJupyterLabPageFixture, name: string): Promise<void> {
  await page.notebook.createNew(name);
  await page.notebook.setCell(0, 'code', SETUP);
  await page.notebook.addCell('code', CPU_CELL);
}

/** Light and dark screenshots of the whole page. */
async function lightAndDark(page: IJupyterLabPageFixture, name: string): Promise<void> {
  await shot(page, `${name}-light`);
  await page.theme.setDarkTheme();
  await expect(page.locator('.jp-GpuMem-sidebarBody')).toBeVisible();
  await shot(page, `${name}-dark`);
  await page.theme.setLightTheme();
}

test.describe('the report list follows a running notebook', () => {
  test('reports appear, are replaced and add up as cells run, without reopening', async ({
    page
  }) => {
    test.setTimeout(180000); // a cold kernel imports torch on a small machine
    await newNotebook(page, 'live.ipynb');
    await openSidebar(page);
    const reports = page.locator('.jp-GpuMem-reports');
    await expect(reports).toContainText('live.ipynb');
    await expect(reports).toContainText(EMPTY_LIST);

    // Run All: the report arrives while the notebook stays open.
    await page.notebook.run();
    const items = page.locator('.jp-GpuMem-reportItem');
    await expect(items).toHaveCount(1, { timeout: 30000 });
    await expect(items.nth(0)).toHaveText(item('cpu-tensors', '8 MiB (CPU)'));
    await expect(reports).not.toContainText(EMPTY_LIST);
    const first = await countOf(items.nth(0));
    expect(first).toBeGreaterThan(0);

    // Re-running the cell replaces its report; a new cell adds one, newest first.
    await page.notebook.runCell(1, { inplace: true });
    await expect.poll(() => countOf(items.nth(0)), { timeout: 30000 }).toBeGreaterThan(first);
    await expect(items).toHaveCount(1);
    await expect(items.nth(0)).toHaveText(item('cpu-tensors', '8 MiB (CPU)'));
    const rerun = await countOf(items.nth(0));
    await page.notebook.addCell('code', SECOND_CELL);
    await page.notebook.runCell(2, { inplace: true });
    await expect(items).toHaveCount(2, { timeout: 30000 });
    await expect(items.nth(0)).toHaveText(item('second', '1 MiB (CPU)'));
    await expect(items.nth(1)).toHaveText(item('cpu-tensors', '8 MiB (CPU)'));
    expect(await countOf(items.nth(0))).toBeGreaterThan(rerun);

    // Clearing the outputs empties the list again.
    await page.menu.clickMenuItem('Edit>Clear Outputs of All Cells');
    await expect(reports).toContainText(EMPTY_LIST);
    await page.notebook.runCell(1, { inplace: true });
    await expect(items).toHaveCount(1, { timeout: 30000 });
    await page.notebook.runCell(2, { inplace: true });
    await expect(items).toHaveCount(2, { timeout: 30000 });

    // The stand-in's GPUs are there too, with this kernel's host memory below them.
    await expect(page.locator('.jp-GpuMem-card')).toHaveCount(2);
    await expect(page.locator('.jp-GpuMem-hostDetail')).toContainText(/^pid \d+/, {
      timeout: 10000
    });
    // One timeline per report: our renderer's. The kernel heard from this front end that the
    // renderer is here, so no bqplot widget view is added beside it.
    const reportViews = page.locator('.jp-Notebook .jp-GpuMem-reportView');
    await expect(reportViews).toHaveCount(2);
    for (let i = 0; i < 2; i++) {
      await expect(reportViews.nth(i).locator('figure.jp-GpuMem-timeline')).toHaveCount(1);
    }
    await expect(page.locator('.jp-Notebook .bqplot')).toHaveCount(0);
    await expect(page.locator('.jp-Notebook .jp-gpumem-timeline')).toHaveCount(0); // no SVG copy
    // No screenshot here: the stand-in counts this kernel as a GPU process holding 22 GiB
    // while its cells report CPU tensors, a page no user sees. sidebar-nogpu-* shows this
    // flow on a machine without a GPU, notebook-reports-* the GPU one.
  });
});

test.describe('without a GPU', () => {
  useNoGpuServer();

  test('the panel explains, and shows the kernel host memory and CPU reports', async ({
    page
  }) => {
    test.setTimeout(180000);
    await openSidebar(page);
    const noGpu = page.locator('.jp-GpuMem-noGpu');
    await expect(noGpu).toContainText(
      'No NVIDIA GPU is visible to this server (NVML: library not found). Reports of CPU ' +
        'tensors still appear below; run on a machine with an NVIDIA driver for live GPU gauges.'
    );
    await expect(page.locator('.jp-GpuMem-card')).toHaveCount(0);
    await expect(page.locator(STATUS)).toHaveText('GPU: n/a');

    await newNotebook(page, 'cpu.ipynb');
    await page.notebook.run();
    const items = page.locator('.jp-GpuMem-reportItem');
    await expect(items).toHaveCount(1, { timeout: 30000 });
    await expect(items.nth(0)).toHaveText(item('cpu-tensors', '8 MiB (CPU)'));

    // The kernel's process tree, in host memory: a Python with torch holds megabytes.
    const host = page.locator('.jp-GpuMem-host');
    await expect(host.locator('[role=meter]')).toHaveCount(1, { timeout: 10000 });
    const rss = Number(await host.locator('[role=meter]').getAttribute('aria-valuenow'));
    expect(rss).toBeGreaterThan(50 * 2 ** 20);
    await expect(host.locator('[role=meter]')).toHaveAttribute(
      'aria-valuetext',
      /^[\d.]+ [MG]iB of [\d.]+ GiB \(\d+%\)$/
    );
    await expect(host.locator('.jp-GpuMem-hostDetail')).toHaveText(
      /^pid \d+.* · [\d.]+ [MG]iB available on this machine$/
    );
    await expect(page.locator(STATUS)).toHaveText(/^GPU: n\/a · kernel [\d.]+ [MG]iB$/);
    await expect(page.locator(STATUS)).toHaveAttribute(
      'title',
      /No NVIDIA GPU is visible to this server.*kernel holds [\d.]+ [MG]iB of host memory/
    );
    await page.notebook.getCellLocator(1).then(cell => cell?.scrollIntoViewIfNeeded());
    await lightAndDark(page, 'sidebar-nogpu');
  });
});
