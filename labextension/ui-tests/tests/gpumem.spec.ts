/**
 * UI tests of the jupyter-gpumem labextension, against the NVML stand-in that
 * jupyter_server_test_config.py configures (an H100 and an A100 in MIG mode with one instance, a
 * process per kernel and two others).
 *
 * Screenshots are written through screenshotPath() (light and dark theme) for people to look
 * at; they are not compared pixel by pixel. They show only what a user could see: the reports
 * are recorded ones or stand-ins whose figures add up, and the HTML injection attempts live in
 * a test of their own that takes no screenshot.
 */
import { expect, IJupyterLabPageFixture, test } from '@jupyterlab/galata';
import * as fs from 'fs';
import * as path from 'path';
import { fixture, notebook, openNotebook, reportCell } from './notebooks';
import { rootLauncher, screenshotPath } from './screenshots';

const SIDEBAR_ID = 'jupyter-gpumem:sidebar';
const STATUS = '[id="jupyter-gpumem:status"]';
const XSS = '<img src=x onerror=alert(1)>';
const GiB = 2 ** 30;
const SHOTS = path.resolve(__dirname, '..', 'screenshots');

async function shot(page: IJupyterLabPageFixture, name: string): Promise<void> {
  fs.mkdirSync(SHOTS, { recursive: true });
  await page.sidebar.close('left');
  await page.screenshot({ path: screenshotPath(`${name}.png`) });
}

async function openSidebar(page: IJupyterLabPageFixture): Promise<void> {
  await page.sidebar.openTab(SIDEBAR_ID);
  await page.sidebar.setWidth(380, 'right');
  await expect(page.locator('.jp-GpuMem-card')).toHaveCount(2);
}

/**
 * A notebook whose outputs carry report bundles (no kernel execution needed): a training step
 * with a 16 GiB budget (tests/fixtures/report.json), an evaluation under `--no-trace` (peak
 * counters only, so no breakdown), and the training step again at 1.5 times the batch, which
 * goes over the budget. The last one's process memory is what the stand-in's kernels hold.
 */
function reportNotebook(): string {
  const train = fixture('report.json');
  const device = train.devices[0];
  const evaluate = {
    ...fixture('report.json'),
    id: 'eval-8',
    name: 'eval',
    execution_count: 8,
    started_at: train.started_at + 60,
    wall_s: 0.84,
    source: 'counters',
    budget_bytes: null,
    over_budget: false
  };
  Object.assign(evaluate.devices[0], {
    allocated_before_bytes: device.allocated_after_bytes,
    allocated_after_bytes: device.allocated_after_bytes,
    allocated_delta_bytes: 0,
    peak_allocated_bytes: 3 * GiB,
    peak_reserved_bytes: device.reserved_after_bytes,
    cache_bytes: device.reserved_after_bytes - device.allocated_after_bytes,
    breakdown: null,
    peak_phase: null,
    peak_step: null
  });
  // Batch 48 instead of 32: activations, inputs and temporaries grow by half.
  const bigger = {
    ...fixture('report.json'),
    id: 'batch48-9',
    name: 'batch 48',
    execution_count: 9,
    started_at: train.started_at + 120,
    wall_s: 5.13,
    over_budget: true
  };
  const scaled = { ...device.breakdown };
  for (const category of ['activations', 'inputs', 'temporary']) {
    scaled[category] = Math.round(scaled[category] * 1.5);
  }
  const peak = Object.values(scaled).reduce((a: number, b) => a + (b as number), 0) as number;
  const process = 22 * GiB; // the stand-in's kernel process
  const reserved = process - device.non_torch_bytes;
  Object.assign(bigger.devices[0], {
    allocated_before_bytes: device.allocated_after_bytes,
    allocated_after_bytes: device.allocated_after_bytes,
    allocated_delta_bytes: 0,
    peak_allocated_bytes: peak,
    peak_reserved_bytes: reserved,
    reserved_after_bytes: reserved,
    cache_bytes: reserved - device.allocated_after_bytes,
    nvml_process_bytes: process,
    breakdown: scaled
  });
  const loop = 'for batch in batches:\n    step(batch)';
  const code = (id: string, source: string, report: any) =>
    reportCell(id, source, report, {
      'text/html': '<div class="gpumem-html-fallback">HTML fallback</div>',
      'text/plain': `gpumem report ${report.name}`
    });
  return notebook([
    { cell_type: 'markdown', id: 'intro', metadata: {}, source: '# GPU memory reports' },
    code('train', `%%gpumem --name train --budget 16GiB\n${loop}`, train),
    code(
      'eval',
      '%%gpumem --name eval --no-trace\nwith torch.no_grad():\n    evaluate(model)',
      evaluate
    ),
    code(
      'bigger',
      `%%gpumem --name "batch 48" --budget 16GiB\n${loop.replace('batches', 'batches_48')}`,
      bigger
    )
  ]);
}

/**
 * The report recorded on the GPU machine, a bigger batch of a training step that ran out of
 * memory on an H100 (tests/fixtures/ui_report_gpu_oom.json, a stand-in whose figures add up:
 * it asks for the logits' 18.4 GiB with 13.2 GiB free), and a training step recorded on the
 * CPU (reserved is allocated there; long tensor names).
 */
function gpuNotebook(): string {
  return notebook([
    reportCell(
      'recorded',
      '%%gpumem\nfor step in range(3):\n    train_step(x)',
      fixture('report_gpu_training_step.json')
    ),
    reportCell(
      'oom',
      '%%gpumem --name "batch 192"\nfor batch in batches_192:\n' +
        '    logits = model(batch[:, :-1])\n' +
        '    loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())\n' +
        '    loss.backward()',
      fixture('ui_report_gpu_oom.json')
    ),
    reportCell(
      'cpu',
      '%%gpumem --name cpu-training-step\nfor step in range(3):\n    train_step(x)',
      fixture('report_cpu_training_step.json')
    )
  ]);
}

/**
 * A report whose every string from the kernel is an HTML injection attempt: its name, error,
 * notes, warnings, a tensor's name and a leak hint's message, fix and holder; and one without
 * devices (a cell on a machine without CUDA, as old versions reported it).
 */
function hostileNotebook(): string {
  const report = fixture('report_gpu_training_step.json');
  Object.assign(report, {
    id: 'hostile-3',
    name: XSS,
    execution_count: 3,
    status: 'error',
    error: XSS,
    notes: [XSS],
    warnings: [XSS],
    leak_hints: [
      { kind: 'output-cache', bytes: 16 * 2 ** 20, message: XSS, fix: XSS, where: [XSS] }
    ]
  });
  report.devices[0].tensors[0].name = XSS;
  const noDevices = {
    schema: 1,
    id: 'cpu-4',
    name: 'no cuda',
    execution_count: 4,
    started_at: report.started_at + 60,
    wall_s: 0.012,
    status: 'ok',
    error: null,
    cuda_available: false,
    source: 'counters',
    notes: ['No CUDA device is present: the cell ran unchanged.'],
    warnings: [],
    devices: []
  };
  return notebook([
    reportCell('hostile', `%%gpumem --name "${XSS}"\nx = 1`, report),
    reportCell('none', '%%gpumem --name "no cuda"\nx = torch.ones(4)', noDevices)
  ]);
}

/**
 * A `generate` call's report (schema 3): its breakdown has a KV cache, its timeline a
 * prefill band and decode bands, and it has the peak by module. Only its structure is checked,
 * not its numbers: the fixture may be re-recorded (on the CPU now, on a GPU later).
 */
function generateNotebook(): string {
  const report = fixture('report_gpu_generate.json');
  return notebook([
      reportCell(
        'generate',
        '%%gpumem --name generate\nout = model.generate(ids, max_new_tokens=40, do_sample=False)',
        report
      )
  ]);
}

test.describe('jupyter-gpumem', () => {
  test('the sidebar shows a card per GPU of the stand-in and their processes', async ({
    page
  }) => {
    const errors: string[] = [];
    page.on('console', message => {
      if (message.type() === 'error' && /gpumem/i.test(message.text())) {
        errors.push(message.text());
      }
    });
    await openSidebar(page);

    const cards = page.locator('.jp-GpuMem-card');
    await expect(cards.nth(0)).toContainText('GPU 0');
    await expect(cards.nth(0)).toContainText('NVIDIA H100 80GB HBM3');
    await expect(cards.nth(0)).toContainText('31/79.6 GiB (39%)');
    await expect(cards.nth(0)).toContainText('util 87%');
    await expect(cards.nth(0).locator('.jp-GpuMem-sparkLine')).toHaveCount(1);
    await expect(cards.nth(0).locator('.jp-GpuMem-command')).toHaveText([
      'python train.py --config gpt2.yaml',
      'python evaluate.py --checkpoint runs/gpt2/last.pt'
    ]);
    // A GPU in MIG mode shows as its instances, numbered as torch sees them.
    await expect(cards.nth(1)).toContainText('GPU 1');
    await expect(cards.nth(1)).toContainText('NVIDIA A100-SXM4-40GB MIG 3g.20gb');
    await expect(cards.nth(1)).toContainText('MIG of GPU 1');
    await expect(cards.nth(1)).toContainText('util – (not supported)');
    await expect(page.locator('.jp-GpuMem-driver')).toHaveText('driver 550.54.15');
    expect(errors).toEqual([]);

    await rootLauncher(page);
    await shot(page, 'sidebar-light');
    await page.theme.setDarkTheme();
    await expect(page.locator('.jp-GpuMem-card')).toHaveCount(2);
    await shot(page, 'sidebar-dark');
    await page.theme.setLightTheme();
  });

  test('the status bar item shows the busiest GPU and follows new samples', async ({ page }) => {
    const item = page.locator(STATUS);
    await expect(item).toHaveText('GPU 0: 31/79.6 GiB');

    // The server's next samples say GPU 1's MIG instance is nearly full.
    let full = true;
    await page.route('**/jupyter-gpumem/api/sample*', async route => {
      if (!full) {
        return route.continue();
      }
      const response = await route.fetch();
      const sample = await response.json();
      sample.devices[1].memory_used_bytes = 19 * GiB;
      await route.fulfill({ response, json: sample });
    });
    await expect(item).toHaveText('GPU 1: 19/19.8 GiB', { timeout: 10000 });
    full = false;
    await expect(item).toHaveText('GPU 0: 31/79.6 GiB', { timeout: 10000 });

    // Clicking it opens the sidebar.
    await item.click();
    await expect(page.locator('.jp-GpuMem-card')).toHaveCount(2);
  });

  test('the sidebar says why when NVML is unavailable, and when the server fails', async ({
    page
  }) => {
    await openSidebar(page);
    // One handler whose answer the test switches: NVML unavailable, server failing, real.
    let mode: 'unavailable' | 'failing' | 'real' = 'unavailable';
    await page.route('**/jupyter-gpumem/api/sample*', async route => {
      if (mode === 'unavailable') {
        await route.fulfill({
          json: {
            time: Date.now() / 1000,
            interval_s: 1,
            available: false,
            reason: 'driver not loaded',
            driver_version: null,
            devices: []
          }
        });
      } else if (mode === 'failing') {
        await route.fulfill({ status: 502, json: { message: 'sampler stopped' } });
      } else {
        await route.continue();
      }
    });
    await expect(page.locator('.jp-GpuMem-unavailable')).toHaveText(
      'NVML unavailabledriver not loaded',
      { timeout: 10000 }
    );
    await expect(page.locator('.jp-GpuMem-card')).toHaveCount(0);
    await expect(page.locator(STATUS)).toHaveText('GPU: n/a');
    await rootLauncher(page);
    await shot(page, 'sidebar-unavailable-light');

    mode = 'failing';
    await expect(page.locator('.jp-GpuMem-error')).toContainText('sampler stopped', {
      timeout: 10000
    });
    mode = 'real';
    // The poll backs off while failing, but only to a few seconds after one failure.
    await expect(page.locator('.jp-GpuMem-error')).toHaveCount(0, { timeout: 30000 });
    await expect(page.locator('.jp-GpuMem-card')).toHaveCount(2);
  });

  test('reports in a notebook render with the mime renderer and are listed in the sidebar', async ({
    page,
    tmpPath
  }) => {
    const name = 'reports.ipynb';
    await openNotebook(page, tmpPath, name, reportNotebook());

    const views = page.locator('.jp-Notebook .jp-GpuMem-reportView');
    await expect(views).toHaveCount(3);
    await expect(page.locator('.gpumem-html-fallback')).toHaveCount(0);
    await expect(views.nth(0)).toContainText('%%gpumem train');
    await expect(views.nth(0)).toContainText('Peak allocated14.7 GiB');
    await expect(views.nth(0)).toContainText('Peak reserved15.5 GiB');
    await expect(views.nth(0)).toContainText('forward, step 2');
    await expect(views.nth(0).locator('.jp-GpuMem-stackedBar .jp-GpuMem-seg')).toHaveCount(8);
    // --no-trace: the peak counters, no breakdown and no budget.
    await expect(views.nth(1)).toContainText('peak counters');
    await expect(views.nth(1)).toContainText('Peak allocated3 GiB');
    await expect(views.nth(1).locator('.jp-GpuMem-stackedBar')).toHaveCount(0);
    await expect(views.nth(1).locator('.jp-GpuMem-messages.jp-mod-warning')).toHaveCount(0);
    // The bigger batch goes over the budget: the budget warning, in the user's units.
    await expect(views.nth(2)).toContainText('Budget16 GiB (exceeded)');
    await expect(views.nth(2).locator('.jp-GpuMem-messages.jp-mod-warning')).toHaveText(
      /peak 21\.1 GiB on cuda:0 exceeds the budget of 16 GiB by 5\.09 GiB/
    );

    await openSidebar(page);
    const items = page.locator('.jp-GpuMem-reportItem');
    await expect(items).toHaveCount(3);
    await expect(items.nth(0)).toContainText('[9] batch 48');
    await expect(items.nth(0)).toContainText('peak 21.1 GiB · 5.13 s');
    await expect(items.nth(1)).toContainText('[8] eval');
    await expect(items.nth(2)).toContainText('[7] train');
    await expect(items.nth(2)).toContainText('peak 14.7 GiB · 3.42 s');
    await expect(page.locator('.jp-GpuMem-reports .jp-GpuMem-sectionTitle')).toContainText(name);

    // The notebook's kernel runs as a (fake) GPU process: its row is highlighted.
    await expect(page.locator('.jp-GpuMem-process.jp-mod-kernel')).toHaveCount(1, {
      timeout: 30000
    });
    await expect(page.locator('.jp-GpuMem-process.jp-mod-kernel')).toContainText('this notebook');

    // Clicking a report selects its cell.
    await items.nth(2).click();
    await expect(page.locator('.jp-Notebook .jp-Cell.jp-mod-active')).toContainText(
      '--name train'
    );
    // The kernel's host memory as after these cells: it has torch loaded (run silently, so
    // the notebook's cells and outputs stay as they are).
    await page.evaluate(async () => {
      const kernel = (window as any).jupyterapp.shell.currentWidget.sessionContext.session.kernel;
      await kernel.requestExecute({ code: 'import torch', silent: true, store_history: false })
        .done;
    });
    const rss = page.locator('.jp-GpuMem-host [role=meter]');
    await expect
      .poll(async () => Number(await rss.getAttribute('aria-valuenow')), { timeout: 20000 })
      .toBeGreaterThan(200 * 2 ** 20);
    await page.setViewportSize({ width: 1440, height: 1300 }); // the three reports whole
    await page.notebook.getCellLocator(1).then(cell => cell?.scrollIntoViewIfNeeded());
    await shot(page, 'notebook-reports-light');
    await page.theme.setDarkTheme();
    await expect(views).toHaveCount(3);
    await shot(page, 'notebook-reports-dark');
    await page.theme.setLightTheme();
  });

  test('reports recorded on a GPU and on the CPU show timeline, tensors, OOM and hints', async ({
    page,
    tmpPath
  }) => {
    const dialogs: string[] = [];
    page.on('dialog', async dialog => {
      dialogs.push(dialog.message());
      await dialog.dismiss();
    });
    const name = 'gpu-report.ipynb';
    await openNotebook(page, tmpPath, name, gpuNotebook());

    const views = page.locator('.jp-Notebook .jp-GpuMem-reportView');
    await expect(views).toHaveCount(3);
    const recorded = views.nth(0);
    await expect(recorded).toContainText('cuda:0 · NVIDIA H200');
    await expect(recorded).toContainText('Memory over the cell on cuda:0');
    await expect(recorded.locator('path.jp-GpuMem-series')).toHaveCount(2);
    await expect(recorded.locator('rect.jp-GpuMem-band')).toHaveCount(9);
    await expect(recorded.locator('circle.jp-GpuMem-timelinePeak')).toHaveCount(1);
    await expect(recorded.locator('.jp-GpuMem-timelinePeakLabel')).toHaveText(
      'peak 782 MiB at 0.6 ms'
    );
    await expect(recorded).toContainText('Tensors the cell left alive on cuda:0');
    await expect(recorded.locator('tr.jp-GpuMem-tensor')).toHaveCount(10);
    await expect(recorded.locator('tr.jp-GpuMem-tensor').nth(0)).toContainText('4096×1024');
    await expect(recorded).toContainText('Largest freed: 16 MiB from cell line 7');

    // The chart fills the output's width and the peak's dot lies on the allocated line.
    const svg = await recorded.locator('svg.jp-GpuMem-timelineSvg').boundingBox();
    expect(svg?.width ?? 0).toBeGreaterThan(500);
    expect(svg?.height ?? 0).toBeGreaterThan(90);
    const line = await recorded.locator('path.jp-mod-allocated').boundingBox();
    const dot = await recorded.locator('circle.jp-GpuMem-timelinePeak').boundingBox();
    expect(line && dot).toBeTruthy();
    expect(Math.abs(dot!.y + dot!.height / 2 - line!.y)).toBeLessThan(3);
    // The peak's label sits in its own row above the plot area, inside its width.
    const label = await recorded.locator('.jp-GpuMem-timelinePeakLabel').boundingBox();
    expect(label!.y + label!.height).toBeLessThanOrEqual(svg!.y);
    expect(label!.x).toBeGreaterThanOrEqual(svg!.x - 1);
    expect(label!.x + label!.width).toBeLessThanOrEqual(svg!.x + svg!.width + 1);

    // The bigger batch asks for the logits' 18.4 GiB with 13.2 GiB free: what was live, the
    // largest of it, and the traceback that keeps it alive after the error.
    const oom = views.nth(1);
    await expect(oom).toContainText('cuda:0 · NVIDIA H100 80GB HBM3');
    await expect(oom.locator('.jp-GpuMem-oom')).toContainText(
      'Out of memory on cuda:0, asking for 18.4 GiB'
    );
    await expect(oom.locator('.jp-GpuMem-oom')).toContainText(
      'Most of what was live: Activations (62.4 GiB)'
    );
    await expect(oom.locator('.jp-GpuMem-oom tr.jp-GpuMem-tensor')).toHaveCount(5);
    await expect(oom.locator('li.jp-GpuMem-leak')).toHaveCount(1);
    await expect(oom.locator('.jp-GpuMem-leakMessage')).toContainText(
      "The last error's traceback keeps 62.4 GiB of tensors alive in the locals of " +
        'forward() line 27.'
    );
    // Code spans of the hints are <code>, without their backticks.
    await expect(oom.locator('.jp-GpuMem-leakFix code')).toHaveText(['%gpumem free', '%debug']);
    await expect(oom.locator('.jp-GpuMem-leaks')).not.toContainText('`');

    // On the CPU reserved is allocated: one line and no "Reserved" legend entry; the peak
    // comes late, so its label ends at the leader, inside the plot; names are whole.
    const cpu = views.nth(2);
    await expect(cpu.locator('path.jp-GpuMem-series')).toHaveCount(1);
    await expect(cpu.locator('path.jp-mod-allocated')).toHaveCount(1);
    await expect(cpu.locator('.jp-GpuMem-timelineLegend')).not.toContainText('Reserved');
    const cpuSvg = await cpu.locator('svg.jp-GpuMem-timelineSvg').boundingBox();
    const cpuLabel = await cpu.locator('.jp-GpuMem-timelinePeakLabel').boundingBox();
    const cpuDot = await cpu.locator('circle.jp-GpuMem-timelinePeak').boundingBox();
    expect(cpuLabel!.y + cpuLabel!.height).toBeLessThanOrEqual(cpuSvg!.y);
    expect(cpuLabel!.x + cpuLabel!.width).toBeLessThanOrEqual(cpuSvg!.x + cpuSvg!.width + 1);
    expect(Math.abs(cpuLabel!.x + cpuLabel!.width - (cpuDot!.x + cpuDot!.width / 2))).toBeLessThan(
      2
    );
    await expect(cpu.locator('td.jp-GpuMem-tensorName').nth(0)).toHaveText(
      "opt.state[model.transformer_encoder.0.feed_forward_intermediate_dense.weight]['exp_avg']"
    );
    await expect(cpu.locator('.jp-GpuMem-leakFix code')).toHaveText([
      'loss.item()',
      'loss.detach()',
      'del'
    ]);
    await expect(page.locator('.jp-Notebook .jp-GpuMem-report img')).toHaveCount(0);
    expect(dialogs).toEqual([]);

    fs.mkdirSync(SHOTS, { recursive: true });
    await page.sidebar.close('left');
    await page.setViewportSize({ width: 1440, height: 1300 }); // the CPU report whole
    for (const theme of ['light', 'dark'] as const) {
      if (theme === 'dark') {
        await page.theme.setDarkTheme();
        await expect(views).toHaveCount(3);
      }
      await recorded.scrollIntoViewIfNeeded();
      await recorded.screenshot({ path: screenshotPath(`report-gpu-${theme}.png`) });
      await oom.scrollIntoViewIfNeeded();
      await oom.screenshot({ path: screenshotPath(`report-oom-${theme}.png`) });
      await cpu.scrollIntoViewIfNeeded();
      await cpu.screenshot({ path: screenshotPath(`report-cpu-${theme}.png`) });
    }
    await page.theme.setLightTheme();
  });

  test('strings from the kernel and from NVML show as text, never as markup', async ({
    page,
    tmpPath
  }) => {
    const dialogs: string[] = [];
    page.on('dialog', async dialog => {
      dialogs.push(dialog.message());
      await dialog.dismiss();
    });
    // A GPU process whose command is an injection attempt, added to the server's samples.
    await page.route('**/jupyter-gpumem/api/sample*', async route => {
      const response = await route.fetch();
      const sample = await response.json();
      sample.devices[0].processes.push({ pid: 4242, command: XSS, memory_bytes: GiB });
      await route.fulfill({ response, json: sample });
    });
    await openNotebook(page, tmpPath, 'hostile.ipynb', hostileNotebook());
    const views = page.locator('.jp-Notebook .jp-GpuMem-reportView');
    await expect(views).toHaveCount(2);
    const hostile = views.nth(0);
    await expect(hostile).toContainText(`%%gpumem ${XSS}`);
    await expect(hostile.locator('.jp-GpuMem-leakMessage', { hasText: XSS })).toHaveCount(1);
    await expect(hostile.locator('.jp-GpuMem-leakFix', { hasText: XSS })).toHaveCount(1);
    await expect(hostile.locator('td.jp-GpuMem-tensorName', { hasText: XSS })).toHaveCount(1);
    await expect(hostile.locator('.jp-GpuMem-messages.jp-mod-warning')).toContainText(XSS);
    await expect(hostile.locator('.jp-GpuMem-messages.jp-mod-note')).toContainText(XSS);
    await expect(hostile.locator('.jp-GpuMem-reportError')).toHaveText(XSS);
    // A report without devices: a note, and no figures.
    await expect(views.nth(1)).toContainText('No CUDA device is present');

    await openSidebar(page);
    const command = page.locator('.jp-GpuMem-command', { hasText: XSS });
    await expect(command).toHaveCount(1, { timeout: 10000 });
    const items = page.locator('.jp-GpuMem-reportItem');
    await expect(items).toHaveCount(2);
    await expect(items.nth(0)).toContainText('[4] no cuda');
    await expect(items.nth(0)).toContainText('peak –');
    await expect(items.nth(1)).toContainText(`[3] ${XSS}`);

    await expect(page.locator('.jp-Notebook .jp-GpuMem-report img')).toHaveCount(0);
    await expect(page.locator('.jp-GpuMem-sidebar img')).toHaveCount(0);
    await page.waitForTimeout(1500); // a few polls, so an injected handler would have run
    expect(dialogs).toEqual([]);
  });

  test('a generate report shows its KV cache, and prefill and decode bands apart', async ({
    page,
    tmpPath
  }) => {
    const name = 'generate-report.ipynb';
    await openNotebook(page, tmpPath, name, generateNotebook());

    const view = page.locator('.jp-Notebook .jp-GpuMem-reportView');
    await expect(view).toHaveCount(1);
    await expect(view).toContainText('%%gpumem generate');
    const kv = view.locator('.jp-GpuMem-stackedBar .jp-GpuMem-seg-14');
    await expect(kv).toHaveCount(1);
    await expect(kv).toHaveAttribute('title', /^KV cache: /);
    await expect(view.locator('.jp-GpuMem-breakdown .jp-GpuMem-legend')).toContainText(
      'KV cache'
    );
    const legend = view.locator('.jp-GpuMem-timelineLegend');
    await expect(legend).toContainText('Prefill');
    await expect(legend).toContainText('Decode');
    await expect(view.locator('rect.jp-GpuMem-band[data-phase="prefill"]')).toHaveCount(1);
    expect(await view.locator('rect.jp-GpuMem-band[data-phase="decode"]').count()).toBeGreaterThan(
      1
    );
    await expect(view.locator('.jp-GpuMem-messages.jp-mod-warning')).toHaveCount(0);

    /** The computed colours of the KV cache segment, and of the prefill and decode bands. */
    const colours = async () => ({
      kv: await kv.evaluate(e => getComputedStyle(e).backgroundColor),
      prefill: await view
        .locator('rect.jp-GpuMem-band[data-phase="prefill"]')
        .evaluate(e => getComputedStyle(e).fill),
      decode: await view
        .locator('rect.jp-GpuMem-band[data-phase="decode"]')
        .first()
        .evaluate(e => getComputedStyle(e).fill)
    });

    // The peak by module (schema 3) is part of the report.
    await expect(view.locator('.jp-GpuMem-modules')).toHaveCount(1);

    fs.mkdirSync(SHOTS, { recursive: true });
    await page.sidebar.close('left');
    await page.setViewportSize({ width: 1440, height: 1300 }); // the report whole
    const seen: Record<string, { kv: string; prefill: string; decode: string }> = {};
    for (const theme of ['light', 'dark'] as const) {
      if (theme === 'dark') {
        await page.theme.setDarkTheme();
        await expect(view).toHaveCount(1);
      }
      seen[theme] = await colours();
      await view.scrollIntoViewIfNeeded();
      await view.screenshot({ path: screenshotPath(`report-generate-${theme}.png`) });
    }
    await page.theme.setLightTheme();
    for (const c of Object.values(seen)) {
      expect(c.prefill).not.toBe(c.decode);
      expect(c.decode).toBe(c.kv); // a decode step grows the KV cache: one colour
      for (const value of Object.values(c)) {
        expect(value).toMatch(/^rgb\(/); // resolved, not transparent or unset
      }
    }
    // The KV cache colour has a dark-theme value of its own.
    expect(seen.dark.kv).not.toBe(seen.light.kv);
  });

  test('the units setting switches to decimal gigabytes', async ({ page }) => {
    await expect(page.locator(STATUS)).toHaveText('GPU 0: 31/79.6 GiB');
    // From the page, so that Galata's settings stand-in sees it too.
    const status = await page.evaluate(async () => {
      const response = await fetch('/lab/api/settings/jupyter-gpumem:plugin', {
        method: 'PUT',
        body: JSON.stringify({ raw: '{"units": "GB"}' })
      });
      return response.status;
    });
    expect(status).toBeLessThan(300);
    await page.reload();
    await expect(page.locator(STATUS)).toHaveText('GPU 0: 33.3/85.5 GB');
    await openSidebar(page);
    await expect(page.locator('.jp-GpuMem-card').nth(0)).toContainText('33.3/85.5 GB (39%)');
  });
});
