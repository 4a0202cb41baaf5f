/**
 * "Will it run?" as a user first runs it on a machine without a GPU: notebooks/will_it_run.ipynb
 * (a copy uploaded to the test's folder, so the committed file is never rewritten) runs in a
 * real kernel on the CPU, on the no-GPU server of no_gpu_server.ts. The estimate of a meta
 * model's `generate` names its KV cache, the largest batch and longest context are printed, the
 * map is drawn, and the measured call's report sets the estimate beside what it measured.
 * Screenshots, light and dark: the estimate (will_it_run-*), the map (will_it_run-map-*) and the
 * measured report (will_it_run-report-*).
 */
import { expect, test } from '@jupyterlab/galata';
import * as fs from 'fs';
import * as path from 'path';

import { useNoGpuServer } from './no_gpu_server';
import { screenshotPath } from './screenshots';

const NOTEBOOK = path.resolve(__dirname, '..', '..', '..', 'notebooks', 'will_it_run.ipynb');
const STDERR = '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]';
const ERROR = '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.error"]';

test.describe('will it run, on the CPU', () => {
  useNoGpuServer();

  test('estimates, maps and measures, light and dark', async ({ page, tmpPath }) => {
    test.setTimeout(420000); // a cold kernel imports torch and transformers on a small machine
    const name = 'will_it_run.ipynb';
    const content = fs.readFileSync(NOTEBOOK, 'utf-8');
    await page.contents.uploadContent(content, 'text', `${tmpPath}/${name}`);
    await page.notebook.openByPath(`${tmpPath}/${name}`);
    await page.notebook.activate(name);
    await page.sidebar.close('left');
    await page.notebook.run();

    const notebook = page.locator('.jp-Notebook');
    await expect(notebook.locator(ERROR)).toHaveCount(0);
    await expect(notebook.locator(STDERR)).toHaveCount(0);
    const estimate = page
      .locator('.jp-Notebook .jp-Cell', { hasText: 'est = jupyter_gpumem.estimate_generate' })
      .first(); // the meta model's, before the small one's
    await expect(estimate.locator('.jp-OutputArea')).toContainText(/kv cache\s*[\d.]+ MiB/);
    const printed = page.locator('.jp-Notebook .jp-Cell', { hasText: 'max_generate_batch' });
    await expect(printed.locator('.jp-OutputArea')).toContainText(
      /the largest batch within 512MiB at 2048 \+ 256 tokens: \d+/
    );
    await expect(printed.locator('.jp-OutputArea')).toContainText(
      /the longest context at batch 16 within 512MiB: \d+ tokens/
    );
    const chart = page.locator('.jp-Notebook .jp-Cell', { hasText: 'found.chart()' });
    await expect(chart.locator('.jp-OutputArea svg').first()).toBeVisible({ timeout: 60000 });
    const report = page.locator('.jp-Notebook .jp-GpuMem-reportView');
    await expect(report).toHaveCount(1, { timeout: 60000 });
    await expect(report).toContainText(/estimated .* measured/);

    for (const theme of ['light', 'dark'] as const) {
      if (theme === 'dark') {
        await page.theme.setDarkTheme();
        await expect(report).toHaveCount(1);
      }
      await page.setViewportSize({ width: 1440, height: 1000 });
      await estimate.evaluate(e => e.scrollIntoView({ block: 'start' }));
      await page.screenshot({ path: screenshotPath(`will_it_run-${theme}.png`) });
      await chart.evaluate(e => e.scrollIntoView({ block: 'start' }));
      await page.screenshot({ path: screenshotPath(`will_it_run-map-${theme}.png`) });
      await page.setViewportSize({ width: 1440, height: 2600 }); // the report whole
      await report.scrollIntoViewIfNeeded();
      await report.screenshot({ path: screenshotPath(`will_it_run-report-${theme}.png`) });
    }
    await page.theme.setLightTheme();
  });
});
