/**
 * The quickstart as a user first runs it on a machine without a GPU: notebooks/quickstart.ipynb
 * (a copy uploaded to the test's folder, so the committed file is never rewritten) runs in a
 * real kernel on the CPU, on the no-GPU server of no_gpu_server.ts; its two `%%gpumem`
 * reports render under their cells and are listed in the sidebar, which says that no GPU is
 * visible. Screenshots, light and dark: the page at the training cell (quickstart-*), and
 * each report whole (quickstart-train-*, quickstart-inference-*).
 */
import { expect, test } from '@jupyterlab/galata';
import * as fs from 'fs';
import * as path from 'path';

import { useNoGpuServer } from './no_gpu_server';
import { screenshotPath } from './screenshots';

const QUICKSTART = path.resolve(__dirname, '..', '..', '..', 'notebooks', 'quickstart.ipynb');
const SIDEBAR_ID = 'jupyter-gpumem:sidebar';
const STDERR = '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]';

test.describe('the quickstart on the CPU', () => {
  useNoGpuServer();

  test('runs and shows its reports, light and dark', async ({ page, tmpPath }) => {
    test.setTimeout(180000); // a cold kernel imports torch on a small machine
    const name = 'quickstart.ipynb';
    const content = fs.readFileSync(QUICKSTART, 'utf-8');
    await page.contents.uploadContent(content, 'text', `${tmpPath}/${name}`);
    await page.notebook.openByPath(`${tmpPath}/${name}`);
    await page.notebook.activate(name);
    await page.sidebar.close('left');
    await page.sidebar.openTab(SIDEBAR_ID);
    await page.sidebar.setWidth(400, 'right');
    await page.notebook.run();

    const views = page.locator('.jp-Notebook .jp-GpuMem-reportView');
    await expect(views).toHaveCount(2, { timeout: 60000 });
    await expect(page.locator(`.jp-Notebook ${STDERR}`)).toHaveCount(0);
    const [train, inference] = [views.nth(0), views.nth(1)];
    await expect(train).toContainText('%%gpumem train');
    await expect(train).toContainText('cpu · CPU tensors');
    await expect(train).toContainText('Budget16 GiB');
    await expect(train).toContainText('No CUDA device: the figures are CPU tensor memory');
    await expect(train.locator('.jp-GpuMem-stackedBar')).toHaveCount(1);
    await expect(train.locator('figure.jp-GpuMem-timeline')).toHaveCount(1);
    await expect(train.locator('.jp-GpuMem-messages.jp-mod-warning')).toHaveCount(0);
    await expect(inference).toContainText('%%gpumem inference');
    await expect(inference).toContainText('cpu · CPU tensors');
    await expect(page.locator('.jp-Notebook .jp-GpuMem-report img')).toHaveCount(0);

    // The sidebar: no GPU, the kernel's host memory, the two reports newest first.
    await expect(page.locator('.jp-GpuMem-noGpu')).toContainText('No NVIDIA GPU is visible');
    await expect(page.locator('.jp-GpuMem-host [role=meter]')).toHaveCount(1, { timeout: 10000 });
    const items = page.locator('.jp-GpuMem-reportItem');
    await expect(items).toHaveCount(2);
    await expect(items.nth(0)).toHaveText(/^\[\d+\] inferenceok.*peak [\d.]+ [KM]iB \(CPU\) · /);
    await expect(items.nth(1)).toHaveText(/^\[\d+\] trainok.*peak [\d.]+ [KM]iB \(CPU\) · /);

    // The training cell at the top of the notebook's view.
    const cell = page.locator('.jp-Notebook .jp-Cell', { hasText: '%%gpumem --name train' });
    for (const theme of ['light', 'dark'] as const) {
      if (theme === 'dark') {
        await page.theme.setDarkTheme();
        await expect(views).toHaveCount(2);
      }
      await page.setViewportSize({ width: 1440, height: 1000 });
      await cell.evaluate(e => e.scrollIntoView({ block: 'start' }));
      await page.screenshot({ path: screenshotPath(`quickstart-${theme}.png`) });
      await page.setViewportSize({ width: 1440, height: 2600 }); // each report whole
      for (const [view, report] of [
        [train, 'train'],
        [inference, 'inference']
      ] as const) {
        await view.scrollIntoViewIfNeeded();
        await view.screenshot({ path: screenshotPath(`quickstart-${report}-${theme}.png`) });
      }
    }
    await page.theme.setLightTheme();
  });
});
