import * as fs from 'fs';
import * as path from 'path';

import {
  breakdownSegments,
  CATEGORIES,
  categoryColor,
  categoryLabel,
  phaseOf,
  PHASES,
  UNKNOWN_COLOR
} from '../categories';

const CSS = fs.readFileSync(path.resolve(__dirname, '..', '..', '..', 'style', 'base.css'), 'utf-8');

/** The colour a `jp-GpuMem-seg-N` rule sets, light theme or dark (`null` when none). */
function cssColor(index: number, dark = false): string | null {
  const selector = `${dark ? "[data-jp-theme-light='false'] " : ''}.jp-GpuMem-seg-${index}`;
  const escaped = selector.replace(/[.*+?^${}()|[\]\\']/g, '\\$&');
  const match = new RegExp(`(^|\\n)${escaped} \\{[^}]*--jp-GpuMem-seg-color: ([^;]+);`).exec(CSS);
  return match ? match[2] : null;
}

describe('categories', () => {
  it('names the categories of report schema 2', () => {
    expect(categoryLabel('kv_cache')).toBe('KV cache');
    expect(categoryLabel('library_workspace')).toBe('Library workspaces');
    expect(categoryLabel('cuda_graph_pool')).toBe('CUDA graph pool');
    expect(categoryLabel('some_new_thing')).toBe('some new thing');
  });

  it('keeps the colours of the schema 1 categories and gives the new ones new indices', () => {
    const schema1 = [
      'parameters',
      'gradients',
      'optimizer_state',
      'optimizer_scratch',
      'activations',
      'inputs',
      'other',
      'temporary',
      'unattributed',
      'cache',
      'cuda_context',
      'allocator_slack',
      'communication'
    ];
    expect(schema1.map(categoryColor)).toEqual([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
    expect(['kv_cache', 'library_workspace', 'cuda_graph_pool'].map(categoryColor)).toEqual([
      14, 15, 16
    ]);
    expect(categoryColor('zeta')).toBe(UNKNOWN_COLOR);
    const colors = CATEGORIES.map(c => c.color);
    expect(new Set(colors).size).toBe(colors.length);
    expect(colors).not.toContain(UNKNOWN_COLOR);
  });

  it('shows the KV cache after the optimizer, workspaces and graph pools after unattributed', () => {
    const segments = breakdownSegments({
      cache: 1,
      cuda_graph_pool: 1,
      library_workspace: 1,
      unattributed: 1,
      activations: 1,
      kv_cache: 1,
      optimizer_scratch: 1,
      optimizer_state: 1,
      zeta: 1
    });
    expect(segments.map(s => s.label)).toEqual([
      'Optimizer state',
      'Optimizer scratch',
      'KV cache',
      'Activations',
      'Unattributed blocks',
      'Library workspaces',
      'CUDA graph pool',
      'Allocator cache',
      'zeta'
    ]);
    expect(segments.map(s => s.color)).toEqual([2, 3, 14, 4, 8, 15, 16, 9, UNKNOWN_COLOR]);
  });

  it('has a style for every colour, light and dark where the theme has no variable', () => {
    for (const { color } of [...CATEGORIES, ...PHASES]) {
      expect(cssColor(color)).not.toBeNull();
    }
    // Unknown categories stay a neutral grey.
    expect(cssColor(UNKNOWN_COLOR)).toBe('var(--jp-border-color1)');
    for (const index of [14, 15, 16]) {
      const light = cssColor(index);
      const dark = cssColor(index, true);
      expect(light).toMatch(/^#[0-9a-f]{6}$/);
      expect(dark).toMatch(/^#[0-9a-f]{6}$/);
      expect(dark).not.toBe(light);
    }
    const own = [14, 15, 16].map(i => cssColor(i));
    expect(new Set(own).size).toBe(3);
  });
});

describe('PHASES', () => {
  it('colours prefill and decode apart from each other and from training', () => {
    expect(PHASES.map(p => p.label)).toEqual([
      'Forward',
      'Backward',
      'Optimizer',
      'Prefill',
      'Decode',
      'Other'
    ]);
    expect(phaseOf('prefill').color).toBe(categoryColor('inputs'));
    expect(phaseOf('decode').color).toBe(categoryColor('kv_cache'));
    const colors = PHASES.map(p => p.color);
    expect(new Set(colors).size).toBe(colors.length);
    expect(phaseOf('sampling').key).toBe('other');
  });
});
