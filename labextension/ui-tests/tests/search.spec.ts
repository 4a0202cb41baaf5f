/**
 * UI test of the tuner's "Search" (`Tuner.search`, `Trial.search`) against a running kernel:
 * notebooks/search.ipynb builds the tiny GPT-like model of tuner.ipynb on the CPU with an fp32
 * AdamW optimizer named `opt`, a trial and a 4.5 MiB budget, and shows the panel. The test
 * presses Search and checks what the eye would: the chart draws memory saved against step-time
 * cost with a filled point per candidate on the front (as many as its title says), the dashed
 * budget line, the winner as a named diamond and its measured run as an outlined ring, the
 * baseline at the origin, nothing cut at the figure's edge; the reasoning's first line says what
 * of the training math is kept; the configuration line names exactly the winner, and Apply
 * applies it. Screenshots of the panel, light and dark (search-light.png, search-dark.png).
 */
import { expect, test } from '@jupyterlab/galata';
import { Locator } from '@playwright/test';
import * as fs from 'fs';
import * as path from 'path';

import { screenshotPath } from './screenshots';

const NOTEBOOK = path.resolve(__dirname, '..', 'notebooks', 'search.ipynb');
const BLUE = 'rgb(78, 121, 167)'; // search_chart.COLORS: a candidate, as the other charts
/** search_chart.COLORS["winner"]: the theme's success colour, as each theme resolves it. */
const GREEN = { light: 'rgb(56, 142, 60)', dark: 'rgb(76, 175, 80)' };

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

/** Texts outside the figure's SVG and points outside its plot area, one line per problem. */
async function clipped(figure: Locator): Promise<string[]> {
  const svg = await figure.locator('svg.svg-figure').boundingBox();
  const plot = await figure.locator('svg.svg-figure rect.plotarea_events').boundingBox();
  if (!svg || !plot) {
    return ['the figure has no SVG plot area'];
  }
  const problems: string[] = [];
  const found = async (selector: string) =>
    figure.locator(selector).evaluateAll(elements =>
      elements
        .map(e => {
          const r = e.getBoundingClientRect();
          return { x: r.x, y: r.y, width: r.width, height: r.height, text: e.textContent ?? '' };
        })
        .filter(b => b.width > 0 || b.height > 0)
    );
  for (const text of await found('svg text')) {
    const where = outside(text, svg);
    if (text.text.trim() && where) {
      problems.push(`text "${text.text}" is outside the figure: ${where}`);
    }
  }
  for (const dot of await found('path.dot')) {
    const where = outside(dot, plot);
    if (where) {
      problems.push(`a point is outside the plot area: ${where}`);
    }
  }
  return problems;
}

/** Each point's computed fill and stroke, counted: "fill stroke" -> how many. */
async function paints(dots: Locator): Promise<Record<string, number>> {
  return dots.evaluateAll(elements => {
    const counts: Record<string, number> = {};
    for (const e of elements) {
      const style = getComputedStyle(e);
      const key = style.fill === 'none' ? `none ${style.stroke}` : style.fill;
      counts[key] = (counts[key] ?? 0) + 1;
    }
    return counts;
  });
}

test.use({ viewport: { width: 1440, height: 1500 } }); // the panel with its search view

test('search draws the front, the budget and the winner, measured; Apply applies it', async ({
  page,
  tmpPath
}) => {
  test.setTimeout(300000); // the search measures a dozen configurations on a small CPU
  await page.contents.uploadContent(
    fs.readFileSync(NOTEBOOK, 'utf-8'),
    'text',
    `${tmpPath}/search.ipynb`
  );
  await page.notebook.openByPath(`${tmpPath}/search.ipynb`);
  await page.notebook.activate('search.ipynb');
  await page.sidebar.close('left');
  await page.notebook.run();
  const panel = page
    .locator('.jp-Notebook .jp-OutputArea-output .widget-vbox', { hasText: 'Technique tuner' })
    .first();
  await expect(panel).toContainText('TinyGPT, 198,400 parameters', { timeout: 60000 });
  await expect(panel).toContainText('configuration: baseline (Apply applies it)');
  const search = panel.getByRole('button', { name: 'Search', exact: true });
  await expect(search).toBeEnabled(); // a trial and a budget

  const status = panel.locator('.widget-label', {
    hasText:
      /^(not measured yet|estimating|measuring|confirming|verifying|search|applied|reverted|failed)/
  });
  await search.click();
  await expect(status).toHaveText(/^(searched and verified|searched: nothing fits|failed)$/, {
    timeout: 240000
  });
  const messages = panel.locator('.widget-html-content > div[style*="color"]');
  expect(await status.textContent(), (await messages.allInnerTexts()).join('\n')).toBe(
    'searched and verified'
  );

  // The reasoning: its first line says what of the training math is kept.
  const reasoning = panel.locator('.jp-gpumem-search-reasoning');
  await expect(reasoning.locator('b').first()).toHaveText(
    /^Keeps your optimizer, adamw \(or its variants .*\) and fp32 master weights/
  );
  await expect(reasoning).toContainText('Verified by a measured run');
  const said = (await reasoning.innerText()).match(/Winner: (.*?): estimated/);
  expect(said, await reasoning.innerText()).not.toBeNull();
  const winner = said![1];
  // The panel holds exactly the winner, micro-batches included.
  await expect(panel).toContainText(`configuration: ${winner} (Apply applies it)`);

  // The chart: a filled point per candidate on the front, as many as its title says.
  const chart = panel.locator('.bqplot.figure', { hasText: 'candidates on the front' });
  await expect(chart).toHaveCount(1);
  const title = (await chart.locator('text.mainheading').textContent()) ?? '';
  expect(title).toMatch(/^memory saved vs step-time cost: \d+ of \d+ candidates on the front$/);
  const front = Number(title.match(/: (\d+) of/)![1]);
  // How many points the front holds follows the timed steps: on a busy CPU the smallest
  // candidate can also time the fastest and beat every other one.
  expect(front).toBeGreaterThanOrEqual(1);
  const dots = chart.locator('path.dot');
  // the front, the baseline's ring, the measured winner's ring, the winner's diamond
  await expect(dots).toHaveCount(front + 3);
  expect(await paints(dots)).toEqual({
    [BLUE]: front,
    [GREEN.light]: 1,
    [`none ${GREEN.light}`]: 1,
    'none rgba(0, 0, 0, 0.87)': 1
  });
  await expect(chart.locator('text.dot_text:visible')).toHaveText(['baseline', 'winner']);
  await expect(chart.locator('path.line')).toHaveCount(1); // the budget
  const legend = panel.locator('.jp-gpumem-search-legend');
  await expect(legend).toHaveText(
    new RegExp(
      [
        'estimated \\(composed\\): the front',
        'winner \\(its own estimate\\)',
        'winner measured',
        'baseline',
        'budget 4\\.50 MiB: save \\d+% or more'
      ].join('\\s*')
    )
  );
  await expect(panel.locator('.jp-gpumem-search-winner')).toContainText(
    `Winner: ${winner}: estimated`
  );
  await expect(panel.locator('.jp-gpumem-search-winner')).toContainText('; measured ');
  await chart.scrollIntoViewIfNeeded();
  await expect(async () => {
    expect(await clipped(chart)).toEqual([]);
  }).toPass({ timeout: 10000 });

  // The verified run joins the table after the baseline.
  const table = panel.locator('table.jp-gpumem-tuner-results');
  await expect(table.locator('tbody tr td:nth-child(1)')).toHaveText([
    'baseline',
    `search · ${winner}`
  ]);

  for (const theme of ['light', 'dark'] as const) {
    if (theme === 'dark') {
      await page.theme.setDarkTheme();
      await expect(chart).toHaveCount(1);
      expect(await paints(dots)).toMatchObject({
        [GREEN.dark]: 1,
        [`none ${GREEN.dark}`]: 1,
        'none rgba(255, 255, 255, 0.87)': 1
      });
    }
    // The panel from its title down to the table: what Search changed. The panel is taller
    // than the notebook's view, so its top goes to the top of the view.
    await panel.evaluate(e => e.scrollIntoView({ block: 'start' }));
    await page.mouse.move(0, 0); // no figure toolbar shown on hover
    const top = (await panel.boundingBox())!;
    const bottom = (await table.boundingBox())!;
    await page.screenshot({
      path: screenshotPath(`search-${theme}.png`),
      clip: { x: top.x, y: top.y, width: top.width, height: bottom.y + bottom.height + 8 - top.y }
    });
  }
  await page.theme.setLightTheme();

  // Apply applies exactly the winner.
  await panel.getByRole('button', { name: 'Apply' }).click();
  const escaped = winner.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
  await expect(status).toHaveText(new RegExp(`^applied ${escaped}`));
  await panel.getByRole('button', { name: 'Revert' }).click();
  await expect(status).toHaveText(/^reverted .*: the model is as it was/);
});
