/**
 * How far will `generate` go, in a running kernel: notebooks/generate.ipynb builds a tiny
 * GPT-2 on the meta device and maps its `generate` of 16 new tokens over batches 1-16 and
 * contexts 64-1024 within 20 MiB (`generate_map`), shows the map as its table, then as its
 * chart (`GenerateMap.chart()`), then one estimate (`estimate_generate`). The test checks
 * what the eye would: which cells fit in the table and on the chart (a square per cell in
 * the theme's colours), the frontier's step line through the longest fitting context of each
 * batch, a cell's tooltip, nothing cut at the figure's edge, the estimate's report; then
 * shoots the three outputs, light and dark (generate-light.png, generate-dark.png).
 */
import { expect, test } from '@jupyterlab/galata';
import { Locator } from '@playwright/test';
import * as fs from 'fs';
import * as path from 'path';

import { screenshotPath } from './screenshots';

const NOTEBOOK = path.resolve(__dirname, '..', 'notebooks', 'generate.ipynb');
const STDERR = '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]';

/** 20 MiB: batch 1 fits up to 1024 tokens, 2 up to 512, 4 up to 256, 8 up to 128, 16 none. */
const FRONTIER: [number, number][] = [
  [1024, 1],
  [512, 2],
  [256, 4],
  [128, 8]
];
const FITS = 5 + 4 + 3 + 2; // cells that fit, of 5 x 5
const OVER = 4; // estimated, over the budget: one per batch from 2 up
const LEFT_OUT = 25 - FITS - OVER; // over too, as a smaller one is, and not estimated

/** generate_chart.COLORS as each theme resolves them. */
const THEMES = {
  light: { fits: 'rgb(56, 142, 60)', over: 'rgb(211, 47, 47)', line: 'rgba(0, 0, 0, 0.87)' },
  dark: { fits: 'rgb(76, 175, 80)', over: 'rgb(244, 67, 54)', line: 'rgba(255, 255, 255, 0.87)' }
};

interface Dot {
  x: number;
  y: number;
  fill: string;
  opacity: string;
  square: boolean;
}

/** Every scatter point of ``figure``: its centre in the marks' frame, fill, opacity, shape. */
async function dots(figure: Locator): Promise<Dot[]> {
  return figure.locator('path.dot').evaluateAll(elements =>
    elements.map(e => {
      // bqplot places each point by its group's transform, the line by its path's corners.
      const [x, y] = (e.parentElement?.getAttribute('transform') ?? '')
        .replace(/^translate\(|\)$/g, '')
        .split(/[ ,]+/)
        .map(Number);
      const style = getComputedStyle(e);
      // d3's square symbol is drawn with straight lines only, its circle with arcs.
      const square = !/[aA]/.test(e.getAttribute('d') ?? '');
      return { x, y, fill: style.fill, opacity: style.opacity, square };
    })
  );
}

/** The corners of the frontier's line, in the marks' frame, and its stroke. */
async function frontier(figure: Locator): Promise<{ points: number[][]; stroke: string }> {
  return figure.locator('path.line').evaluate(e => ({
    points: (e.getAttribute('d') ?? '')
      .split(/[ML]/)
      .filter(s => s.trim())
      .map(s => s.split(/[ ,]+/).filter(Boolean).map(Number)),
    stroke: getComputedStyle(e).stroke
  }));
}

/** Ticks by where they lie (px) and their labels: along the x axis, and up the y axis. */
type Ticks = { x: [number, string][]; y: [number, string][] };

async function tickLabels(figure: Locator): Promise<Ticks> {
  const all = await figure.locator('g.tick').evaluateAll(elements =>
    elements.map(e => {
      const [x, y] = (e.getAttribute('transform') ?? '')
        .replace(/^translate\(|\)$/g, '')
        .split(/[ ,]+/)
        .map(Number);
      return { x, y, text: e.textContent ?? '' };
    })
  );
  return {
    x: all.filter(t => t.y === 0).map(t => [t.x, t.text]),
    y: all.filter(t => t.x === 0).map(t => [t.y, t.text])
  };
}

/** The label of the tick at ``at`` px; '' for none. d3 draws ticks half a pixel off, crisp. */
function label(along: [number, string][], at: number): string {
  return along.find(([px]) => Math.abs(px - at) <= 1)?.[1] ?? '';
}

/** How many of ``items`` hold each value of ``key``. */
function counts<T>(items: T[], key: (item: T) => string): Record<string, number> {
  const out: Record<string, number> = {};
  for (const item of items) {
    out[key(item)] = (out[key(item)] ?? 0) + 1;
  }
  return out;
}

/** Texts shown in ``figure`` that poke out of its SVG, or ticks that overlap each other. */
async function misplaced(figure: Locator): Promise<string[]> {
  return figure.locator('svg.svg-figure').evaluate(svg => {
    const outer = svg.getBoundingClientRect();
    const problems: string[] = [];
    const texts = [...svg.querySelectorAll('text')].filter(t => {
      const r = t.getBoundingClientRect();
      const style = getComputedStyle(t);
      const hidden = style.visibility === 'hidden' || style.opacity === '0';
      return t.textContent?.trim() && r.width > 0 && r.height > 0 && !hidden;
    });
    for (const t of texts) {
      const r = t.getBoundingClientRect();
      if (
        r.left < outer.left - 1 ||
        r.top < outer.top - 1 ||
        r.right > outer.right + 1 ||
        r.bottom > outer.bottom + 1
      ) {
        problems.push(`"${t.textContent}" is outside the figure`);
      }
    }
    const ticks = [...svg.querySelectorAll('g.tick text')].map(t => t.getBoundingClientRect());
    ticks.forEach((a, i) =>
      ticks.slice(i + 1).forEach(b => {
        const apart =
          a.right <= b.left || b.right <= a.left || a.bottom <= b.top || b.bottom <= a.top;
        if (!apart) {
          problems.push(`ticks overlap at (${a.left}, ${a.top}) and (${b.left}, ${b.top})`);
        }
      })
    );
    return problems;
  });
}

test.use({ viewport: { width: 1440, height: 1400 } });

test('a generate map as a table and a chart with its frontier, then an estimate', async ({
  page,
  tmpPath
}) => {
  test.setTimeout(180000); // a cold kernel imports torch and transformers on a small machine
  const name = 'generate.ipynb';
  const content = fs.readFileSync(NOTEBOOK, 'utf-8');
  await page.contents.uploadContent(content, 'text', `${tmpPath}/${name}`);
  await page.notebook.openByPath(`${tmpPath}/${name}`);
  await page.notebook.activate(name);
  await page.sidebar.close('left');
  await page.notebook.run();

  const report = page.locator('.jp-Notebook .jp-gpumem-estimate');
  await expect(report).toHaveCount(1, { timeout: 90000 });
  await expect(page.locator(`.jp-Notebook ${STDERR}`)).toHaveCount(0);

  // The table: fitting cells and those over, whether estimated or left out.
  const table = page.locator('.jp-Notebook .gpumem-map');
  await expect(table.locator('p')).toHaveText(
    /^generate, 16 new tokens: estimated peak by batch and total context, within 20\.0 MiB /
  );
  await expect(table.locator('td.gpumem-map-fits')).toHaveCount(FITS);
  await expect(table.locator('td.gpumem-map-over')).toHaveCount(OVER + LEFT_OUT);
  await expect(table.locator('td.gpumem-map-unknown')).toHaveCount(0);
  const row = (batch: number) =>
    table.locator('tr', { has: page.locator(`th:text-is("${batch}")`) });
  await expect(row(1).locator('td.gpumem-map-fits')).toHaveCount(5);
  await expect(row(16).locator('td.gpumem-map-fits')).toHaveCount(0);
  await expect(row(16).locator('td').first()).toHaveText(/MiB x$/);

  // The estimate's report: the peak of 4 prompts of 240 tokens and what it is made of.
  await expect(report).toContainText(
    'gpumem estimate: generate: 4 x 240 tokens + 16 new on cpu, batch 4'
  );
  await expect(report.locator('tr', { hasText: 'peak allocated' })).toContainText('19.0 MiB');
  await expect(report).toContainText('at the peak (prefill):');
  await expect(report).toContainText(/parameters\s+12\.9 MiB/);

  // The chart: its title, its ticks at the map's values, a square per cell.
  const chart = page.locator('.jp-Notebook .widget-vbox', { has: page.locator('.bqplot.figure') });
  await expect(chart).toHaveCount(1);
  await expect(chart.locator('.widget-html').first()).toHaveText(
    'generate, 16 new tokens: what fits within 20.0 MiB allocated'
  );
  const figure = chart.locator('.bqplot.figure');
  const ticks = figure.locator('g.tick text');
  await expect(ticks).toHaveText(['64', '128', '256', '512', '1024', '1', '2', '4', '8', '16']);
  await expect(figure.locator('text.axislabel')).toHaveText([
    'total context: prompt + 16 new tokens',
    'batch size'
  ]);
  await expect(figure.locator('path.dot')).toHaveCount(25 + FRONTIER.length);
  await expect(chart.locator('.jp-gpumem-generate-legend > span')).toHaveText([
    'fits',
    'does not fit',
    'does not fit (left out: a smaller one does not)',
    'frontier: the longest context that fits at each batch'
  ]);

  for (const theme of ['light', 'dark'] as const) {
    const colour = THEMES[theme];
    if (theme === 'dark') {
      await page.theme.setDarkTheme();
      await expect(figure.locator('path.dot')).toHaveCount(25 + FRONTIER.length);
    }
    await figure.scrollIntoViewIfNeeded();
    await expect(async () => {
      const all = await dots(figure);
      const squares = all.filter(d => d.square);
      const points = all.filter(d => !d.square);
      expect(counts(squares, d => d.fill)).toEqual({
        [colour.fits]: FITS,
        [colour.over]: OVER + LEFT_OUT
      });
      expect(counts(squares, d => d.opacity)).toEqual({ '1': FITS + OVER, '0.4': LEFT_OUT });
      expect(counts(points, d => d.fill)).toEqual({ [colour.line]: FRONTIER.length });

      // The frontier: a step line whose every corner is the centre of a fitting square, and a
      // point at the longest fitting context of each batch: 1024 at batch 1 on the right, down
      // to 128 at batch 8, each batch above the last.
      const line = await frontier(figure);
      expect(line.stroke).toBe(colour.line);
      expect(line.points).toHaveLength(2 * FRONTIER.length - 1);
      const at = (x: number, y: number) =>
        squares.filter(s => Math.abs(s.x - x) < 0.5 && Math.abs(s.y - y) < 0.5);
      for (const [x, y] of line.points) {
        expect(at(x, y).map(s => s.fill)).toEqual([colour.fits]);
      }
      const ends = line.points.filter((_, i) => i % 2 === 0);
      const axes = await tickLabels(figure);
      expect(ends.map(([x, y]) => [label(axes.x, x), label(axes.y, y)])).toEqual(
        FRONTIER.map(([context, batch]) => [`${context}`, `${batch}`])
      );
      const px = (x: number, y: number) => [Math.round(x * 10) / 10, Math.round(y * 10) / 10];
      expect(points.map(p => px(p.x, p.y))).toEqual(ends.map(([x, y]) => px(x, y)));
      for (let i = 1; i < ends.length; i++) {
        expect(ends[i][0]).toBeLessThan(ends[i - 1][0]); // a shorter context
        expect(ends[i][1]).toBeLessThan(ends[i - 1][1]); // higher up: a larger batch
      }
      expect(await misplaced(figure)).toEqual([]);
    }).toPass({ timeout: 10000 });

    // A square's tooltip: its batch, context, estimated peak, the KV cache at it, the phase.
    const all = await dots(figure);
    const over = all.findIndex(d => d.square && d.fill === colour.over && d.opacity === '1');
    await figure.locator('path.dot').nth(over).hover();
    const tooltip = page.locator('.bqplot_mark_tooltip', { hasText: 'estimate' });
    await expect(tooltip).toBeVisible();
    await expect(tooltip.locator('.datafield')).toHaveText(['batch', 'context', 'estimate']);
    await expect(tooltip.locator('.datavalue')).toHaveText([
      '2',
      '1024',
      // The prefill's peak holds the cache it has just written: never 0 B.
      /^does not fit: peak 25\.\d MiB in prefill, of which KV cache [1-9][\d.]* MiB$/
    ]);
    await page.mouse.move(0, 0);
    await expect(tooltip).toBeHidden();

    const first = page.locator('.jp-Notebook .jp-Cell', { has: page.locator('.gpumem-map') });
    await first.evaluate(e => e.scrollIntoView({ block: 'start' }));
    await page.mouse.move(0, 0);
    await expect(figure.locator('.toolbar_div')).toHaveCSS('opacity', '0'); // shown on hover only
    await page.screenshot({ path: screenshotPath(`generate-${theme}.png`) });
  }
  await page.theme.setLightTheme();
});
