import * as React from 'react';
import { act } from 'react';

import { click, fixture, HOSTILE, render } from '../../__tests__/helpers';
import { IModuleNode, parseReport } from '../../wire';
import { cellLabel, moduleTitle } from '../icicle';
import { ModuleSection, showModule } from '../modules';
import {
  icicleLayout,
  initiallyOpen,
  moduleLabel,
  moduleName,
  openTo,
  ownBytes,
  ownTotal,
  pathTo,
  totalBytes,
  treeRows,
  zoomOut,
  zoomToShow
} from '../moduletree';
import { ReportView } from '../renderer';

/** A GPT-2 training step recorded on the CPU: 55 modules, 4 levels under the model. */
const GPT = 'report_cpu_gpt_step.json';

function gptTree(): IModuleNode {
  const tree = parseReport(fixture(GPT)).devices[0].module_tree;
  expect(tree).toBeTruthy();
  return tree as IModuleNode;
}

function node(path: string, bytes: Record<string, number>, children: IModuleNode[] = []) {
  return { path, bytes, children };
}

/** A model of 100 bytes: a block called twice (its own child each time), a tiny norm. */
function small(): IModuleNode {
  return node('', { parameters: 40, activations: 60 }, [
    node('block#0', { parameters: 20, activations: 30 }, [
      node('block.fc#0', { parameters: 20, activations: 10 })
    ]),
    node('block#1', { parameters: 19, activations: 30 }, [
      node('block.fc#1', { parameters: 19, activations: 10 })
    ]),
    node('norm', { parameters: 0.4 })
  ]);
}

/** Click an SVG element (which has no `click()` in jsdom). */
function clickSvg(element: Element): void {
  act(() => {
    element.dispatchEvent(new MouseEvent('click', { bubbles: true }));
  });
}

function walk(root: IModuleNode): IModuleNode[] {
  return [root, ...root.children.flatMap(walk)];
}

describe('module tree arithmetic', () => {
  it('sums a node, and takes its children out for its own bytes', () => {
    const tree = small();
    expect(totalBytes(tree)).toBe(100);
    expect(ownTotal(tree)).toBeCloseTo(100 - 50 - 49 - 0.4);
    expect(ownBytes(tree.children[0])).toEqual({ activations: 20 });
    expect(ownBytes(tree.children[0].children[0])).toEqual({ parameters: 20, activations: 10 });
  });

  it("finds the recorded fixture's largest module as the one with the most own bytes", () => {
    const report = parseReport(fixture(GPT));
    const device = report.devices[0];
    const tree = gptTree();
    expect(report.schema).toBe(3);
    expect(totalBytes(tree)).toBe(device.peak_allocated_bytes);
    const best = walk(tree)
      .slice(1)
      .reduce((a, b) => (ownTotal(b) > ownTotal(a) ? b : a));
    expect(device.largest_module).toEqual({ path: best.path, bytes: ownTotal(best) });
    expect(device.largest_module?.path).toBe('transformer.h.0.mlp.act');
  });

  it('names a module under its parent', () => {
    expect(moduleLabel('')).toBe('model');
    expect(moduleLabel('transformer', '')).toBe('transformer');
    expect(moduleLabel('transformer.h.3', 'transformer')).toBe('h.3');
    expect(moduleLabel('transformer.h.3.attn', 'transformer.h.3')).toBe('attn');
    expect(moduleLabel('block.fc#0', 'block#0')).toBe('fc#0');
    expect(moduleLabel('block#1', '')).toBe('block#1');
    // Not under its parent's name (a module reached another way): the whole path.
    expect(moduleLabel('shared.proj', 'decoder')).toBe('shared.proj');
  });

  it('finds the chain from the root to a module', () => {
    const tree = gptTree();
    expect(pathTo(tree, 'transformer.h.2.attn')?.map(n => n.path)).toEqual([
      '',
      'transformer',
      'transformer.h.2',
      'transformer.h.2.attn'
    ]);
    expect(pathTo(tree, '')?.map(n => n.path)).toEqual(['']);
    expect(pathTo(tree, 'transformer.h.9')).toBeNull();
  });
});

describe('icicleLayout', () => {
  it('gives each child its share of its parent, side by side in the order they ran', () => {
    const { cells, hidden } = icicleLayout(small());
    const at = (path: string) => cells.find(c => c.node.path === path)!;
    expect(at('')).toMatchObject({ depth: 0, x0: 0, x1: 1, parent: null });
    expect(at('block#0').x0).toBe(0);
    expect(at('block#0').x1).toBeCloseTo(0.5);
    expect(at('block#1').x0).toBeCloseTo(0.5);
    expect(at('block#1').x1).toBeCloseTo(0.99);
    expect(at('block.fc#1')).toMatchObject({ depth: 2, parent: 'block#1' });
    expect(at('block.fc#1').x0).toBeCloseTo(0.5);
    expect(at('block.fc#1').x1).toBeCloseTo(0.79);
    // The norm holds 0.4% of the model: not drawn, counted.
    expect(cells.map(c => c.node.path)).toEqual([
      '',
      'block#0',
      'block.fc#0',
      'block#1',
      'block.fc#1'
    ]);
    expect(hidden).toBe(1);
  });

  it("fills a parent's width with its children and its own bytes, on every level", () => {
    const tree = gptTree();
    const { cells } = icicleLayout(tree, { levels: 10, minShare: 0, minWidth: 0 });
    expect(cells).toHaveLength(walk(tree).length);
    for (const cell of cells) {
      const children = cells.filter(c => c.parent === cell.node.path);
      expect(children.map(c => c.node.path)).toEqual(cell.node.children.map(c => c.path));
      const widths = children.reduce((sum, c) => sum + (c.x1 - c.x0), 0);
      const own = (ownTotal(cell.node) / totalBytes(tree)) * 1;
      expect(widths + own).toBeCloseTo(cell.x1 - cell.x0, 9);
      // Children stay inside their parent, one after another.
      let x = cell.x0;
      for (const c of children) {
        expect(c.x0).toBeCloseTo(x, 9);
        expect(c.depth).toBe(cell.depth + 1);
        x = c.x1;
      }
      expect(x).toBeLessThanOrEqual(cell.x1 + 1e-9);
    }
  });

  it('draws a few levels below the zoomed node, and leaves out the tiniest', () => {
    const tree = gptTree();
    const two = icicleLayout(tree, { levels: 2 });
    expect(Math.max(...two.cells.map(c => c.depth))).toBe(2);
    const all = icicleLayout(tree);
    expect(Math.max(...all.cells.map(c => c.depth))).toBe(4);
    // transformer.wpe holds 0.3% of the model: not drawn at the model's zoom.
    expect(all.cells.some(c => c.node.path === 'transformer.wpe')).toBe(false);
    expect(all.hidden).toBeGreaterThan(0);
    for (const cell of all.cells.filter(c => c.parent !== null)) {
      const parent = all.cells.find(c => c.node.path === cell.parent)!;
      expect((cell.x1 - cell.x0) / (parent.x1 - parent.x0)).toBeGreaterThanOrEqual(0.005);
    }
  });

  it('zooms: the zoomed node spans the width, its children their shares of it', () => {
    const tree = gptTree();
    const block = pathTo(tree, 'transformer.h.0')!.pop()!;
    const { cells } = icicleLayout(block);
    expect(cells[0]).toMatchObject({ depth: 0, x0: 0, x1: 1 });
    const mlp = cells.find(c => c.node.path === 'transformer.h.0.mlp')!;
    expect(mlp.x1 - mlp.x0).toBeCloseTo(13114896 / 24415792, 9);
    expect(cells.every(c => c.node.path.startsWith('transformer.h.0'))).toBe(true);
    expect(zoomOut(tree, 'transformer.h.0')).toBe('transformer');
    expect(zoomOut(tree, '')).toBe('');
  });

  it('zooms to show a module deeper than the levels drawn', () => {
    const tree = gptTree();
    expect(zoomToShow(tree, 'transformer.h.0.mlp.act')).toBe('');
    expect(zoomToShow(tree, 'transformer.h.0.mlp.act', 2)).toBe('transformer.h.0');
    expect(zoomToShow(tree, 'no.such.module')).toBe('');
  });
});

describe('treeRows', () => {
  it('opens the model and its first level at first', () => {
    const tree = gptTree();
    const rows = treeRows(tree, initiallyOpen(tree));
    expect(rows.map(r => `${'  '.repeat(r.depth)}${r.label}`)).toEqual([
      'model',
      '  transformer',
      '    wte',
      '    wpe',
      '    drop',
      '    h.0',
      '    h.1',
      '    h.2',
      '    h.3',
      '    ln_f',
      '  lm_head'
    ]);
    expect(rows.filter(r => r.open).map(r => r.node.path)).toEqual(['', 'transformer']);
  });

  it('opens the ancestors of a module to show its row', () => {
    const tree = gptTree();
    const open = openTo(initiallyOpen(tree), tree, 'transformer.h.3.mlp.act');
    const rows = treeRows(tree, open);
    const act = rows.find(r => r.node.path === 'transformer.h.3.mlp.act');
    expect(act).toMatchObject({ depth: 4, label: 'act', open: false });
    expect(rows.some(r => r.node.path === 'transformer.h.2.mlp')).toBe(false);
  });
});

describe('cellLabel and moduleTitle', () => {
  it('shows what fits: the name and bytes, the name, or nothing', () => {
    expect(cellLabel('transformer', '95.5 MiB', 400)).toBe('transformer · 95.5 MiB');
    expect(cellLabel('transformer', '95.5 MiB', 90)).toBe('transformer');
    expect(cellLabel('transformer', '95.5 MiB', 20)).toBe('');
  });

  it('names the path, the bytes by category and the own bytes', () => {
    const tree = gptTree();
    const attn = pathTo(tree, 'transformer.h.0.attn')!.pop()!;
    expect(moduleTitle(attn, 'GiB')).toBe(
      'transformer.h.0.attn · 9.76 MiB (parameters 258 KiB, optimizer state 516 KiB, ' +
        'activations 9 MiB); own 7.5 MiB'
    );
    expect(moduleTitle(node('x.y', { activations: 1024 }), 'GiB')).toBe(
      'x.y · 1 KiB (activations 1 KiB)'
    );
  });
});

describe('ModuleSection in a report', () => {
  it('shows the peak by module of a schema 3 report: largest module, icicle and tree', () => {
    const host = render(<ReportView report={parseReport(fixture(GPT))} units="GiB" />);
    const section = host.querySelector('.jp-GpuMem-modules') as HTMLElement;
    expect(section).not.toBeNull();
    expect(section.dataset.device).toBe('cpu');
    expect(section.querySelector('.jp-GpuMem-sectionTitle')?.textContent).toBe(
      'At the peak on cpu, by module'
    );
    expect(section.querySelector('.jp-GpuMem-largestModule')?.textContent).toBe(
      'Largest module (own bytes): transformer.h.0.mlp.act 8 MiB'
    );
    // The section follows the breakdown at the peak.
    const titles = Array.from(host.querySelectorAll('.jp-GpuMem-sectionTitle')).map(
      e => e.textContent
    );
    expect(titles.indexOf('At the peak on cpu, by module')).toBe(
      titles.indexOf('At the peak on cpu') + 1
    );
    // The icicle: the model across, coloured by category, hover titles with path and bytes.
    const model = section.querySelector('.jp-GpuMem-iceCell[data-path=""]')!;
    expect(model.querySelector('title')?.textContent).toMatch(
      /^model · 123 MiB \(parameters 4.63 MiB, .*\); own 24.5 MiB$/
    );
    expect(model.querySelectorAll('.jp-GpuMem-iceSeg')).toHaveLength(6);
    expect(model.querySelector('.jp-GpuMem-iceSeg.jp-GpuMem-seg-4')).not.toBeNull();
    const h0 = section.querySelector('.jp-GpuMem-iceCell[data-path="transformer.h.0"]')!;
    expect(h0.querySelector('title')?.textContent).toMatch(/^transformer\.h\.0 · 23\.3 MiB/);
    // The tree: eleven rows open, each with its bytes, a bar and its own bytes.
    const rows = section.querySelectorAll('.jp-GpuMem-moduleRow[role=treeitem]');
    expect(rows).toHaveLength(11);
    const transformer = section.querySelector('[data-path="transformer"][role=treeitem]')!;
    expect(transformer.getAttribute('aria-expanded')).toBe('true');
    expect(transformer.textContent).toContain('95.5 MiB');
    expect(transformer.querySelectorAll('.jp-GpuMem-moduleBar .jp-GpuMem-seg')).toHaveLength(3);
    expect(section.querySelector('.jp-GpuMem-moduleLegend')?.textContent).toContain(
      'Optimizer state'
    );
  });

  it('opens and closes a row, and zooms the icicle in and out', () => {
    const host = render(<ReportView report={parseReport(fixture(GPT))} units="GiB" />);
    const section = host.querySelector('.jp-GpuMem-modules')!;
    const rows = () => section.querySelectorAll('.jp-GpuMem-moduleRow[role=treeitem]').length;
    const toggle = (path: string) =>
      section.querySelector(`[data-path="${path}"][role=treeitem] button.jp-GpuMem-moduleToggle`)!;
    click(toggle('transformer.h.0'));
    expect(rows()).toBe(15);
    click(toggle('transformer'));
    expect(rows()).toBe(3);
    click(toggle('transformer'));
    expect(rows()).toBe(15);

    const crumbs = () =>
      Array.from(section.querySelectorAll('.jp-GpuMem-iceCrumb')).map(e => e.textContent);
    expect(crumbs()).toEqual(['model']);
    clickSvg(section.querySelector('.jp-GpuMem-iceCell[data-path="transformer.h.1"]')!);
    expect(crumbs()).toEqual(['model', 'transformer', 'h.1']);
    const zoomed = section.querySelector('.jp-GpuMem-iceCell.jp-mod-zoomed')!;
    expect(zoomed.getAttribute('data-path')).toBe('transformer.h.1');
    expect(section.querySelector('.jp-GpuMem-iceCell[data-path="transformer.h.0"]')).toBeNull();
    // The top bar zooms out one level; a crumb back to where it names.
    clickSvg(zoomed);
    expect(crumbs()).toEqual(['model', 'transformer']);
    click(section.querySelector('button.jp-GpuMem-iceCrumb')!);
    expect(crumbs()).toEqual(['model']);
  });

  it('shows a module the sidebar asks for: its row opened and marked, in the icicle too', () => {
    const host = render(<ReportView report={parseReport(fixture(GPT))} units="GiB" />);
    const path = 'transformer.h.3.mlp.act';
    expect(host.querySelector(`[data-path="${path}"][role=treeitem]`)).toBeNull();
    let found = false;
    act(() => {
      found = showModule(host, { reportId: 'no-such-report', device: 'cpu', path });
    });
    expect(found).toBe(true);
    const row = host.querySelector(`[data-path="${path}"][role=treeitem]`)!;
    expect(row.classList.contains('jp-mod-highlight')).toBe(true);
    expect(host.querySelectorAll('.jp-GpuMem-moduleRow.jp-mod-highlight')).toHaveLength(1);
    const cell = host.querySelector(`.jp-GpuMem-iceCell[data-path="${path}"]`)!;
    expect(cell.classList.contains('jp-mod-highlight')).toBe(true);
    // No section on another device; none at all in a report without modules.
    expect(showModule(host, { device: 'cuda:0', path })).toBe(false);
    const old = render(<ReportView report={parseReport(fixture('report.json'))} units="GiB" />);
    expect(showModule(old, { device: 'cuda:0', path })).toBe(false);
    // The largest module's link in the section does the same.
    const other = render(<ReportView report={parseReport(fixture(GPT))} units="GiB" />);
    click(other.querySelector('.jp-GpuMem-moduleLink')!);
    expect(
      other.querySelector('.jp-GpuMem-moduleRow.jp-mod-highlight')?.getAttribute('data-path')
    ).toBe('transformer.h.0.mlp.act');
  });

  it('renders module paths as text, never as HTML', () => {
    const tree = node('', { activations: 10 }, [node(HOSTILE, { activations: 9 })]);
    const host = render(
      <ModuleSection
        tree={tree}
        largest={{ path: HOSTILE, bytes: 9 }}
        device="cuda:0"
        label="cuda:0"
        units="GiB"
      />
    );
    expect(host.querySelector('img')).toBeNull();
    expect((host.textContent ?? '').split(HOSTILE).length - 1).toBeGreaterThanOrEqual(2);
  });
});

describe('a module named by an index', () => {
  /** nn.Sequential(Linear, ReLU, Linear): the largest module is its child `2`. */
  function sequential(): IModuleNode {
    return node('', { parameters: 20 * 2 ** 20 }, [
      node('0', { parameters: 4 * 2 ** 20 }),
      node('2', { parameters: 16 * 2 ** 20 })
    ]);
  }

  it('reads as a module, not a number, wherever it stands alone', () => {
    expect(moduleName('')).toBe('model');
    expect(moduleName('2')).toBe('model.2');
    expect(moduleName('0.attn#1')).toBe('model.0.attn#1');
    expect(moduleName('transformer.h.3')).toBe('transformer.h.3');
    expect(moduleTitle(node('2', { parameters: 2 ** 20 }), 'GiB')).toBe(
      'model.2 · 1 MiB (parameters 1 MiB)'
    );
  });

  it('is the largest module as model.2, its link still showing the module 2', () => {
    const host = render(
      <ModuleSection
        tree={sequential()}
        largest={{ path: '2', bytes: 16 * 2 ** 20 }}
        device="cpu"
        label="cpu"
        units="GiB"
      />
    );
    const largest = host.querySelector('.jp-GpuMem-largestModule');
    expect(largest?.textContent).toBe('Largest module (own bytes): model.2 16 MiB');
    const link = host.querySelector('.jp-GpuMem-moduleLink')!;
    expect(link.getAttribute('title')).toBe('Show model.2 in the tree');
    click(link);
    expect(
      host.querySelector('.jp-GpuMem-moduleRow.jp-mod-highlight')?.getAttribute('data-path')
    ).toBe('2');
  });
});

describe('reports without modules', () => {
  it('show no module section in schema 1 and 2 reports, or where the tree is null', () => {
    for (const name of ['report.json', 'report_gpu_training_step.json', 'report_two_ranks.json']) {
      const report = parseReport(fixture(name));
      expect(report.devices.every(d => d.module_tree === null)).toBe(true);
      const host = render(<ReportView report={report} units="GiB" />);
      expect(host.querySelector('.jp-GpuMem-modules')).toBeNull();
    }
    const raw = fixture(GPT);
    raw.devices[0].module_tree = null;
    raw.devices[0].largest_module = null;
    const host = render(<ReportView report={parseReport(raw)} units="GiB" />);
    expect(host.querySelector('.jp-GpuMem-modules')).toBeNull();
    expect(host.textContent).toContain('At the peak on cpu');
  });
});
