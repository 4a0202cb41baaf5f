/**
 * UI test of the technique tuner panel (`jupyter_gpumem.tune`) against a running kernel:
 * notebooks/tuner.ipynb builds a tiny GPT-like model on the CPU with an fp32 AdamW optimizer
 * named `opt` and shows the panel; the test measures three configurations through the
 * panel's own controls, then checks in the DOM what the eye would: no axes before the first
 * run (a line says when the charts come), the dropdowns name the model as it is, no chart
 * text, point or budget line is cut at a figure's edge, the bar chart's legend stays off the
 * bars, and the table's numbers keep to one line. Screenshots of the panel in
 * the light and dark themes go through screenshotPath().
 *
 * The second test (notebooks/gpus.ipynb: the same model with a 5 MiB budget) presses
 * "Will it fit on N GPUs?", which estimates 1, 2, 4 and 8 GPUs with DDP and FSDP2, measures
 * FSDP2 on 2 GPUs through the GPUs and strategy selectors, and checks the per-rank chart: a
 * group per choice, a filled dot per estimated rank, an outlined one per measured rank, the
 * budget line, nothing clipped; then shoots the panel (gpus-light.png, gpus-dark.png).
 */
import { expect, IJupyterLabPageFixture, test } from '@jupyterlab/galata';
import { Locator } from '@playwright/test';
import * as fs from 'fs';
import * as path from 'path';

import { screenshotPath } from './screenshots';

const NOTEBOOKS = path.resolve(__dirname, '..', 'notebooks');
/** The columns of numbers in the results table (tuner_charts.NUMERIC): never wrapped. */
const NUMERIC = ['peak', 'step', 'Δ peak', 'Δ step', 'fits budget'];

interface Box {
  x: number;
  y: number;
  width: number;
  height: number;
}

/** Where ``inner`` pokes out of ``outer``, in words; '' when it lies inside (1 px of slack). */
function outside(inner: Box, outer: Box): string {
  const sides = [
    inner.x < outer.x - 1 && `left by ${outer.x - inner.x} px`,
    inner.y < outer.y - 1 && `top by ${outer.y - inner.y} px`,
    inner.x + inner.width > outer.x + outer.width + 1 &&
      `right by ${inner.x + inner.width - outer.x - outer.width} px`,
    inner.y + inner.height > outer.y + outer.height + 1 &&
      `bottom by ${inner.y + inner.height - outer.y - outer.height} px`
  ];
  return sides.filter(Boolean).join(', ');
}

/** The boxes of every element ``selector`` finds under ``root``, with their text. */
async function boxes(root: Locator, selector: string): Promise<(Box & { text: string })[]> {
  return root.locator(selector).evaluateAll(elements =>
    elements
      .map(e => {
        const r = e.getBoundingClientRect();
        return { x: r.x, y: r.y, width: r.width, height: r.height, text: e.textContent ?? '' };
      })
      .filter(b => b.width > 0 || b.height > 0)
  );
}

/**
 * Everything drawn in a bqplot figure lies where it is seen: its texts (title, ticks, axis
 * labels, point names) inside the figure's SVG, and its marks inside the plot area, whose
 * clip path would cut them otherwise. Returns one line per problem.
 */
async function clipped(figure: Locator, marks: string): Promise<string[]> {
  const svg = await figure.locator('svg.svg-figure').boundingBox();
  const plot = await figure.locator('svg.svg-figure rect.plotarea_events').boundingBox();
  if (!svg || !plot) {
    return ['the figure has no SVG plot area'];
  }
  const problems: string[] = [];
  for (const text of await boxes(figure, 'svg text')) {
    const where = outside(text, svg);
    if (text.text.trim() && where) {
      problems.push(`text "${text.text}" is outside the figure: ${where}`);
    }
  }
  for (const mark of await boxes(figure, marks)) {
    const where = outside(mark, plot);
    if (where) {
      problems.push(`${marks} "${mark.text}" is outside the plot area: ${where}`);
    }
  }
  return problems;
}

/** Lines of text in each cell of the results table's numeric columns, as "column: text". */
async function wrappedNumbers(table: Locator): Promise<string[]> {
  return table.evaluate((element, numeric) => {
    const titles = [...element.querySelectorAll('thead th')].map(th => th.textContent ?? '');
    const wrapped: string[] = [];
    const lines = (cell: Element) => {
      const range = document.createRange();
      range.selectNodeContents(cell);
      return new Set([...range.getClientRects()].map(r => Math.round(r.top))).size;
    };
    element.querySelectorAll('thead th').forEach(th => {
      if (lines(th) > 1) {
        wrapped.push(`heading: ${th.textContent}`);
      }
    });
    element.querySelectorAll('tbody tr').forEach(tr => {
      [...tr.children].forEach((td, i) => {
        if (numeric.includes(titles[i]) && lines(td) > 1) {
          wrapped.push(`${titles[i]}: ${td.textContent}`);
        }
      });
    });
    return wrapped;
  }, NUMERIC);
}

/** The text of the option a dropdown of the panel shows. */
function shown(panel: Locator, description: string): Locator {
  return panel
    .locator('.widget-dropdown', { hasText: description })
    .locator('select option:checked');
}

/** Press Re-run and wait for ``measured`` more rows, ``rows`` in all; a failure fails at once. */
async function rerun(panel: Locator, measured: number, rows: number): Promise<void> {
  const status = panel.locator('.widget-label', { hasText: /^(not )?measur|^failed/ });
  const done = `measured ${measured} configuration(s)`;
  await panel.getByRole('button', { name: 'Re-run' }).click();
  await expect(status).toHaveText(new RegExp(`^(${done.replace(/[()]/g, '\\$&')}|failed)$`), {
    timeout: 60000
  });
  // On failure the panel's messages (message_html: coloured lines) name the exception.
  const messages = panel.locator('.widget-html-content > div[style*="color"]');
  expect(await status.textContent(), (await messages.allInnerTexts()).join('\n')).toBe(done);
  await expect(panel.locator('table.jp-gpumem-tuner-results tbody tr')).toHaveCount(rows);
}

async function openTuner(
  page: IJupyterLabPageFixture,
  tmpPath: string,
  name = 'tuner.ipynb'
): Promise<Locator> {
  await page.contents.uploadContent(
    fs.readFileSync(path.join(NOTEBOOKS, name), 'utf-8'),
    'text',
    `${tmpPath}/${name}`
  );
  await page.notebook.openByPath(`${tmpPath}/${name}`);
  await page.notebook.activate(name);
  await page.sidebar.close('left');
  await page.notebook.run();
  const panel = page
    .locator('.jp-Notebook .jp-OutputArea-output .widget-vbox', { hasText: 'Technique tuner' })
    .first();
  await expect(panel).toContainText('TinyGPT, 198,400 parameters, optimizer variable opt', {
    timeout: 60000
  });
  // No empty axes before the first run: a line says when the charts come.
  await expect(panel.locator('.bqplot.figure')).toHaveCount(0);
  await expect(panel).toContainText('The charts appear after the first measurement');
  await expect(panel).toContainText('not measured yet');
  return panel;
}

test.use({ viewport: { width: 1440, height: 1300 } }); // the whole panel on the screen

test('the tuner panel measures configurations and shows them unclipped, light and dark', async ({
  page,
  tmpPath
}) => {
  test.setTimeout(120000); // about 20 s alone; a cold kernel imports torch on a small machine
  const panel = await openTuner(page, tmpPath);

  // Before anything runs, the "as is" choices name the model and the optimizer as they are.
  await expect(shown(panel, 'precision')).toHaveText('fp32 (as is)');
  await expect(shown(panel, 'optimizer')).toHaveText('adamw (as is: opt)');

  // Checkpointing every block: the baseline is measured first, then the configuration.
  await panel.locator('.widget-checkbox', { hasText: 'all 4 blocks' }).locator('input').check();
  await rerun(panel, 2, 2);
  // bf16 autocast from the precision dropdown, then back to the model as it is.
  await panel.locator('.widget-checkbox', { hasText: 'all 4 blocks' }).locator('input').uncheck();
  const precision = panel.locator('.widget-dropdown', { hasText: 'precision' }).locator('select');
  await precision.selectOption({ label: 'bf16-autocast' });
  await rerun(panel, 1, 3);
  await precision.selectOption({ label: 'fp32 (as is)' });
  await expect(shown(panel, 'precision')).toHaveText('fp32 (as is)');
  await expect(shown(panel, 'optimizer')).toHaveText('adamw (as is: opt)');

  const table = panel.locator('table.jp-gpumem-tuner-results');
  const column = (i: number) => table.locator(`tbody tr td:nth-child(${i})`);
  await expect(table.locator('thead th')).toHaveText([
    'configuration',
    'peak',
    'at the peak',
    'step',
    'Δ peak',
    'Δ step',
    'fits budget'
  ]);
  await expect(column(1)).toHaveText(['baseline', 'ckpt blocks', 'bf16-autocast']);
  // The budget is 5 MiB: only checkpointing fits (6.3, 4.1 and 5.5 MiB at the peak).
  await expect(column(7)).toHaveText(['no', 'yes', 'no']);
  await expect(column(3).nth(0)).toContainText('activations');
  expect(await wrappedNumbers(table)).toEqual([]);

  const breakdown = panel.locator('.bqplot.figure', { hasText: 'breakdown at the peak' });
  const tradeoff = panel.locator('.bqplot.figure', { hasText: 'memory saved vs step-time cost' });
  // A stacked bar per configuration, a named point per configuration, the budget's line.
  await expect(panel.locator('.bqplot.figure')).toHaveCount(2);
  await expect(panel).not.toContainText('The charts appear after the first measurement');
  await expect(breakdown.locator('g.bargroup')).toHaveCount(3);
  await expect(breakdown.locator('path.line')).toHaveCount(1);
  await expect(tradeoff.locator('path.dot')).toHaveCount(3);
  await expect(tradeoff.locator('text.dot_text')).toHaveText([
    'baseline',
    'ckpt blocks',
    'bf16-autocast'
  ]);
  // bqplot lays a figure out again 300 ms after a change, and only while it is on screen.
  await breakdown.scrollIntoViewIfNeeded();
  await expect(async () => {
    expect(await clipped(breakdown, 'rect.bar')).toEqual([]);
    expect(await clipped(breakdown, 'path.line')).toEqual([]);
    expect(await clipped(tradeoff, 'path.dot')).toEqual([]);
    expect(await clipped(tradeoff, 'text.dot_text')).toEqual([]);
  }).toPass({ timeout: 10000 });

  // The legend is HTML under the bar chart, in the page's text colour: off the bars.
  await expect(panel.locator('.bqplot .legendtext')).toHaveCount(0);
  const legend = panel.locator('.jp-gpumem-legend');
  await expect(legend).toContainText('parameters');
  await expect(legend).toContainText('activations');
  await expect(legend).toContainText('budget 5.00 MiB');
  const legendBox = (await legend.boundingBox())!;
  const figureBox = (await breakdown.locator('svg.svg-figure').boundingBox())!;
  expect(legendBox.y).toBeGreaterThanOrEqual(figureBox.y + figureBox.height - 1);
  for (const bar of await boxes(breakdown, 'rect.bar')) {
    expect(bar.y + bar.height).toBeLessThanOrEqual(legendBox.y);
  }

  for (const theme of ['light', 'dark'] as const) {
    if (theme === 'dark') {
      await page.theme.setDarkTheme();
      await expect(panel.locator('.bqplot.figure')).toHaveCount(2);
    }
    await panel.scrollIntoViewIfNeeded();
    await panel.screenshot({ path: screenshotPath(`tuner-${theme}.png`) });
  }
  await page.theme.setLightTheme();
});

const BLUE = 'rgb(78, 121, 167)'; // rank_chart.COLORS: a rank; the worst where ranks differ is red

/** How many of ``dots`` are filled with each colour, as the browser computes it. */
async function fills(dots: Locator): Promise<Record<string, number>> {
  return dots.evaluateAll(elements => {
    const counts: Record<string, number> = {};
    for (const e of elements) {
      const fill = getComputedStyle(e).fill;
      counts[fill] = (counts[fill] ?? 0) + 1;
    }
    return counts;
  });
}

/** Press ``button`` and wait for the status line to read ``done``; a failure fails at once. */
async function press(panel: Locator, button: string, done: string): Promise<void> {
  const status = panel.locator('.widget-label', { hasText: /^(not )?(measur|estimat)|^failed/ });
  await panel.getByRole('button', { name: button }).click();
  const escaped = done.replace(/[()?]/g, '\\$&');
  await expect(status).toHaveText(new RegExp(`^(${escaped}|failed)$`), { timeout: 60000 });
  const messages = panel.locator('.widget-html-content > div[style*="color"]');
  expect(await status.textContent(), (await messages.allInnerTexts()).join('\n')).toBe(done);
}

test('will it fit on N GPUs: each rank estimated and measured against the budget', async ({
  page,
  tmpPath
}) => {
  test.setTimeout(120000);
  await page.setViewportSize({ width: 1440, height: 1700 }); // the panel with its GPU chart
  const panel = await openTuner(page, tmpPath, 'gpus.ipynb');
  const gpus = panel.locator('.widget-dropdown', { hasText: 'GPUs' }).locator('select');
  const strategy = panel.locator('.widget-dropdown', { hasText: 'strategy' }).locator('select');
  await expect(gpus.locator('option')).toHaveText(['1 GPU', '2 GPUs', '4 GPUs', '8 GPUs']);
  await expect(strategy).toBeDisabled(); // one GPU: no strategy
  await expect(panel.locator('.bqplot.figure', { hasText: 'peak per GPU' })).toHaveCount(0);

  await press(panel, 'Will it fit on N GPUs?', 'estimated 7 of 7 choices');
  const chart = panel.locator('.bqplot.figure', { hasText: 'peak per GPU' });
  const ticks = chart.locator('g.tick text').filter({ hasText: /GPU|×/ });
  await expect(ticks).toHaveText([
    '1 GPU',
    'ddp × 2',
    'fsdp2 × 2',
    'ddp × 4',
    'fsdp2 × 4',
    'ddp × 8',
    'fsdp2 × 8'
  ]);
  const dots = chart.locator('path.dot');
  await expect(dots).toHaveCount(1 + 2 * (2 + 4 + 8)); // a filled dot per rank
  const table = panel.locator('table.jp-gpumem-rank-table');
  // Columns empty in every row are left out: find them by their titles.
  const column = async (title: string) => {
    const i = (await table.locator('thead th').allInnerTexts()).indexOf(title);
    expect(i, `column ${title}`).toBeGreaterThanOrEqual(0);
    return table.locator(`tbody tr td:nth-child(${i + 1})`);
  };
  await expect(table.locator('thead th')).toHaveText(['GPUs', 'worst rank', 'estimated', 'fits']);
  // 5 MiB per GPU: only FSDP2 on 4 and 8 GPUs shards enough of the 6.3 MiB.
  await expect(await column('fits')).toHaveText(['no', 'no', 'no', 'no', 'yes', 'no', 'yes']);
  // Every layer shards evenly: the ranks of a choice peak alike, no single rank is the worst.
  const alike = ['all', 'all', 'all', 'all', 'all', 'all'];
  await expect(await column('worst rank')).toHaveText(['', ...alike]);
  expect(await fills(dots)).toEqual({ [BLUE]: 29 }); // estimated: filled, none red

  // Apply on 2 GPUs leaves the GPUs out, and says so.
  await gpus.selectOption({ label: '2 GPUs' });
  await expect(strategy).toBeEnabled();
  await strategy.selectOption('fsdp2');
  await panel.getByRole('button', { name: 'Apply' }).click();
  await expect(panel).toContainText('Apply left out fsdp2 × 2');
  await panel.getByRole('button', { name: 'Revert' }).click();

  // Re-run measures the baseline (1 GPU) and FSDP2 on 2 GPUs: outlined, over their estimates.
  await press(panel, 'Re-run', 'measured 2 configuration(s)');
  await expect(dots).toHaveCount(29 + 1 + 2);
  expect(await fills(dots)).toEqual({ [BLUE]: 29, none: 3 }); // measured: outlined
  await expect(table.locator('thead th')).toHaveText([
    'GPUs',
    'worst rank',
    'estimated',
    'measured',
    'fits'
  ]);
  await expect(await column('measured')).toHaveText([/MiB/, '', /MiB/, '', '', '', '']);

  await chart.scrollIntoViewIfNeeded();
  await expect(async () => {
    expect(await clipped(chart, 'path.dot')).toEqual([]);
    expect(await clipped(chart, 'path.line')).toEqual([]);
  }).toPass({ timeout: 10000 });
  // The legend and the table lie beside or under the plot, never over it.
  const plot = (await chart.locator('svg.svg-figure').boundingBox())!;
  const legend = (await panel.locator('.jp-gpumem-rank-legend').boundingBox())!;
  expect(legend.y).toBeGreaterThanOrEqual(plot.y + plot.height - 1);
  await expect(panel.locator('.jp-gpumem-rank-legend')).toHaveText(
    /estimated\s*measured\s*worst rank, where ranks differ\s*budget 5\.00 MiB per GPU/
  );
  expect((await table.boundingBox())!.x).toBeGreaterThanOrEqual(plot.x + plot.width - 1);

  for (const theme of ['light', 'dark'] as const) {
    if (theme === 'dark') {
      await page.theme.setDarkTheme();
      await expect(chart).toHaveCount(1);
    }
    await panel.scrollIntoViewIfNeeded();
    await page.mouse.move(0, 0); // no figure toolbar shown on hover
    await panel.screenshot({ path: screenshotPath(`gpus-${theme}.png`) });
  }
  await page.theme.setLightTheme();
});
