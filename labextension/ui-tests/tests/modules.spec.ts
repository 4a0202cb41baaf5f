/**
 * The peak by module (report schema 3): the icicle and the tree of a GPT-2 training step
 * recorded on the CPU, and the sidebar's link to a report's largest module.
 */
import { expect, test } from '@jupyterlab/galata';
import { fixture, notebook, openNotebook, reportCell } from './notebooks';
import { screenshotPath } from './screenshots';

const SIDEBAR_ID = 'jupyter-gpumem:sidebar';
const LARGEST = 'transformer.h.0.mlp.act';

/** A schema 1 report (no modules) above the GPT-2 step's report. */
function gptNotebook(): string {
  return notebook([
    reportCell(
      'train',
      '%%gpumem --name train\nfor batch in batches:\n    step(batch)',
      fixture('report.json')
    ),
    reportCell(
      'gpt',
      '%%gpumem --name training-step\n' +
        'loss = model(ids, labels=ids).loss\nloss.backward()\nopt.step()',
      fixture('report_cpu_gpt_step.json')
    )
  ]);
}

test.describe('the peak by module', () => {
  test('a GPT-2 step shows its modules as an icicle and a tree', async ({ page, tmpPath }) => {
    await openNotebook(page, tmpPath, 'gpt-modules.ipynb', gptNotebook());
    const views = page.locator('.jp-Notebook .jp-GpuMem-reportView');
    await expect(views).toHaveCount(2);
    // The schema 1 report has no module section; the GPT-2 step one.
    await expect(views.nth(0).locator('.jp-GpuMem-modules')).toHaveCount(0);
    const section = views.nth(1).locator('.jp-GpuMem-modules');
    await expect(section).toHaveCount(1);
    await expect(section.locator('.jp-GpuMem-sectionTitle')).toHaveText(
      'At the peak on cpu, by module'
    );
    await expect(section.locator('.jp-GpuMem-largestModule')).toContainText(`${LARGEST} 8 MiB`);
    await expect(views.nth(1).locator('.jp-GpuMem-messages.jp-mod-warning')).toHaveCount(0);

    // The icicle: five rows, the model across the full width, labels inside their cells.
    const svg = section.locator('svg.jp-GpuMem-iceSvg');
    const box = (await svg.boundingBox())!;
    expect(box.width).toBeGreaterThan(600);
    expect(box.height).toBe(100);
    const model = section.locator('.jp-GpuMem-iceCell[data-path=""]');
    await expect(model.locator('title')).toHaveText(/^model · 123 MiB \(/);
    const h0 = section.locator('.jp-GpuMem-iceCell[data-path="transformer.h.0"]');
    await expect(h0.locator('.jp-GpuMem-iceLabel')).toHaveText('h.0 · 23.3 MiB');
    for (const label of await section.locator('.jp-GpuMem-iceLabel').all()) {
      const text = (await label.boundingBox())!;
      const cell = (await label.locator('xpath=..').boundingBox())!;
      expect(text.x + text.width).toBeLessThanOrEqual(cell.x + cell.width + 0.5);
    }

    // The tree: the model and its first level open; open one block.
    const rows = section.locator('.jp-GpuMem-moduleRow[role=treeitem]');
    await expect(rows).toHaveCount(11);
    const block = section.locator('[role=treeitem][data-path="transformer.h.0"]');
    await block.locator('button.jp-GpuMem-moduleToggle').click();
    await expect(block).toHaveAttribute('aria-expanded', 'true');
    await expect(rows).toHaveCount(15);
    await expect(section.locator('[role=treeitem][data-path="transformer.h.0.mlp"]')).toContainText(
      '12.5 MiB'
    );

    await page.sidebar.close('left');
    for (const theme of ['light', 'dark'] as const) {
      if (theme === 'dark') {
        await page.theme.setDarkTheme();
        await expect(section).toHaveCount(1);
      }
      await section.scrollIntoViewIfNeeded();
      await section.screenshot({ path: screenshotPath(`report-modules-${theme}.png`) });
    }
    await page.theme.setLightTheme();

    // Zoom into a block and out again by its crumb.
    await section.locator('.jp-GpuMem-iceCell[data-path="transformer.h.1"]').click();
    await expect(section.locator('.jp-GpuMem-iceCrumb')).toHaveText([
      'model',
      'transformer',
      'h.1'
    ]);
    await expect(section.locator('.jp-GpuMem-iceCell.jp-mod-zoomed')).toHaveAttribute(
      'data-path',
      'transformer.h.1'
    );
    await section.locator('button.jp-GpuMem-iceCrumb', { hasText: 'model' }).click();
    await expect(section.locator('.jp-GpuMem-iceCrumb')).toHaveText(['model']);
  });

  test("the sidebar links a report to its largest module and shows it in the report's tree", async ({
    page,
    tmpPath
  }) => {
    await openNotebook(page, tmpPath, 'gpt-sidebar.ipynb', gptNotebook());
    await expect(page.locator('.jp-Notebook .jp-GpuMem-reportView')).toHaveCount(2);
    await page.sidebar.openTab(SIDEBAR_ID);
    await page.sidebar.setWidth(380, 'right');
    const links = page.locator('.jp-GpuMem-reportModule');
    await expect(links).toHaveCount(1);
    await expect(links).toHaveText(`largest:${LARGEST}8 MiB`);

    // Scroll the report away, then follow the link.
    await page.locator('.jp-Notebook .jp-Cell').first().scrollIntoViewIfNeeded();
    await links.click();
    await expect(page.locator('.jp-Notebook .jp-Cell.jp-mod-active')).toContainText(
      '--name training-step'
    );
    const row = page.locator(`.jp-GpuMem-moduleRow.jp-mod-highlight[data-path="${LARGEST}"]`);
    await expect(row).toHaveCount(1);
    await expect(row).toBeInViewport();
    await expect(
      page.locator(`.jp-GpuMem-iceCell.jp-mod-highlight[data-path="${LARGEST}"]`)
    ).toHaveCount(1);
    await page.sidebar.close('left');
    await page.screenshot({ path: screenshotPath('report-modules-sidebar-light.png') });
  });
});
