/**
 * The tuner panel read at a glance in a window of 1500 x 900 px with the file browser open
 * (issue 53): every selector of the configuration row lies where it is seen at the width it
 * asks for, none squeezed or cut off at the output's edge (the rows wrap instead; shot in
 * tuner-1500-controls-light.png), and after a measurement has filled the table and its charts,
 * "Will it fit on N GPUs?" shows its per-GPU chart right under the buttons, with no scrolling,
 * rather than below everything else (tuner-1500-light.png, tuner-1500-dark.png).
 * notebooks/gpus.ipynb: a tiny GPT-like model on the CPU with a Trial and a 5 MiB budget.
 */
import { expect, test } from '@jupyterlab/galata';
import { Locator } from '@playwright/test';
import * as fs from 'fs';
import * as path from 'path';

import { screenshotPath } from './screenshots';

const NOTEBOOK = path.resolve(__dirname, '..', 'notebooks', 'gpus.ipynb');

/** Whether the middle of ``control`` is the control itself there, seen, not covered or clipped. */
async function seen(control: Locator): Promise<boolean> {
  return control.evaluate(e => {
    const r = e.getBoundingClientRect();
    const top = document.elementFromPoint(r.x + r.width / 2, r.y + r.height / 2);
    return top !== null && (top === e || e.contains(top));
  });
}

/** How much narrower than it asks to be ``dropdown`` is drawn (0 where it has its width): a
 * row too long for the notebook squeezes its controls, cutting their text off. */
async function squeezed(dropdown: Locator): Promise<number> {
  return dropdown.evaluate(e => {
    const inline = getComputedStyle(e).getPropertyValue('--jp-widgets-inline-width');
    const wanted = parseFloat((e as HTMLElement).style.width || inline);
    return Math.max(0, Math.round(wanted - e.getBoundingClientRect().width));
  });
}

/** Press ``button`` and wait for the status line to read ``done``; a failure fails at once. */
async function press(panel: Locator, button: string, done: string): Promise<void> {
  const status = panel.locator('.widget-label', { hasText: /^(not )?(measur|estimat)|^failed/ });
  await panel.getByRole('button', { name: button }).click();
  const escaped = done.replace(/[()?]/g, '\\$&');
  await expect(status).toHaveText(new RegExp(`^(${escaped}|failed)$`), { timeout: 90000 });
  const messages = panel.locator('.widget-html-content > div[style*="color"]');
  expect(await status.textContent(), (await messages.allInnerTexts()).join('\n')).toBe(done);
}

test.use({ viewport: { width: 1500, height: 900 } });

test('the tuner at 1500 px with the file browser open: no control cut off, the GPU chart in view', async ({
  page,
  tmpPath
}) => {
  test.setTimeout(180000);
  await page.contents.uploadContent(
    fs.readFileSync(NOTEBOOK, 'utf-8'),
    'text',
    `${tmpPath}/gpus.ipynb`
  );
  await page.notebook.openByPath(`${tmpPath}/gpus.ipynb`);
  await page.notebook.activate('gpus.ipynb');
  await page.sidebar.openTab('filebrowser');
  expect(await page.sidebar.isTabOpen('filebrowser')).toBe(true);
  await page.notebook.run();
  const panel = page
    .locator('.jp-Notebook .jp-OutputArea-output .widget-vbox', { hasText: 'Technique tuner' })
    .first();
  await expect(panel).toContainText('not measured yet', { timeout: 60000 });
  const output = panel.locator('xpath=ancestor::div[contains(@class,"jp-OutputArea-output")]');
  const room = (await output.boundingBox())!;

  for (const name of ['precision', 'optimizer', 'offload', 'GPUs', 'strategy']) {
    const dropdown = panel.locator('.widget-dropdown', { hasText: name });
    const select = dropdown.locator('select');
    await select.scrollIntoViewIfNeeded();
    const box = (await select.boundingBox())!;
    expect(box.x + box.width, `${name} ends inside the output`).toBeLessThanOrEqual(
      room.x + room.width + 1
    );
    expect(await seen(select), `${name} is seen`).toBe(true);
    expect(await squeezed(dropdown), `px cut off ${name}`).toBe(0);
  }
  await panel.evaluate(e => e.scrollIntoView({ block: 'start' }));
  await page.screenshot({ path: screenshotPath('tuner-1500-controls-light.png') });
  // A measurement first: the table and its charts fill the measurements' tab.
  await press(panel, 'Re-run', 'measured 1 configuration(s)');
  const breakdown = panel.locator('.bqplot.figure', { hasText: 'breakdown at the peak' });
  await expect(breakdown).toHaveCount(1);
  // The buttons at the top of the notebook's view, as a user who just pressed one sees them.
  const button = panel.getByRole('button', { name: 'Will it fit on N GPUs?' });
  await button.evaluate(e => e.scrollIntoView({ block: 'start' }));
  await press(panel, 'Will it fit on N GPUs?', 'estimated 7 of 7 choices');
  const chart = panel.locator('.bqplot.figure', { hasText: 'peak per GPU' });
  await expect(chart).toBeVisible();
  await expect(button).toBeInViewport({ ratio: 1 }); // nothing scrolled
  await expect(chart.locator('svg.svg-figure').first()).toBeInViewport({ ratio: 0.95 });
  await expect(panel.locator('.lm-TabBar-tab.lm-mod-current')).toHaveText('per GPU (7)');

  for (const theme of ['light', 'dark'] as const) {
    if (theme === 'dark') {
      await page.theme.setDarkTheme();
      await expect(chart).toBeVisible();
    }
    await page.mouse.move(0, 0);
    await page.screenshot({ path: screenshotPath(`tuner-1500-${theme}.png`) });
  }
  await page.theme.setLightTheme();
});
