/**
 * UI test of the technique tuner panel (`jupyter_gpumem.tune`) against a running kernel:
 * notebooks/tuner.ipynb builds a tiny GPT-like model on the CPU with an fp32 AdamW optimizer
 * named `opt` and shows the panel; the test measures three configurations through the
 * panel's own controls, then checks in the DOM what the eye would: the dropdowns name the
 * model as it is, no chart text or point is cut at a figure's edge, the bar chart's legend
 * stays off the bars, and the table's numbers keep to one line. Screenshots of the panel in
 * the light and dark themes go through screenshotPath().
 */
import { expect, IJupyterLabPageFixture, test } from '@jupyterlab/galata';
import { Locator } from '@playwright/test';
import * as fs from 'fs';
import * as path from 'path';

import { screenshotPath } from './screenshots';

const NOTEBOOK = path.resolve(__dirname, '..', 'notebooks', 'tuner.ipynb');
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

async function openTuner(page: IJupyterLabPageFixture, tmpPath: string): Promise<Locator> {
  const name = 'tuner.ipynb';
  await page.contents.uploadContent(
    fs.readFileSync(NOTEBOOK, 'utf-8'),
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
  await expect(panel.locator('.bqplot.figure')).toHaveCount(2);
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
  // A stacked bar per configuration, a named point per configuration.
  await expect(breakdown.locator('g.bargroup')).toHaveCount(3);
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
    expect(await clipped(tradeoff, 'path.dot')).toEqual([]);
    expect(await clipped(tradeoff, 'text.dot_text')).toEqual([]);
  }).toPass({ timeout: 10000 });

  // The legend is HTML under the bar chart, in the page's text colour: off the bars.
  await expect(panel.locator('.bqplot .legendtext')).toHaveCount(0);
  const legend = panel.locator('.jp-gpumem-legend');
  await expect(legend).toContainText('parameters');
  await expect(legend).toContainText('activations');
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
