/**
 * The breakdown categories and the timeline phases of a report: their display
 * names and their colours (`jp-GpuMem-seg-N` classes in style/base.css), shared
 * by the breakdown bar, the out-of-memory section and the timeline's bands.
 */
import { ISegment } from './stackedbar';

/** A breakdown category (or a phase): its wire name, display name and colour. */
export interface ICategory {
  key: string;
  label: string;
  /** The `jp-GpuMem-seg-N` class index. */
  color: number;
}

/** Colour index of categories (and phases) this extension does not know: a neutral grey. */
export const UNKNOWN_COLOR = 13;

/**
 * The breakdown categories in display order; unknown ones follow. A colour index,
 * once given, stays with its category (old screenshots keep their meaning), so the
 * categories of report schema 2 (KV cache, library workspaces, CUDA graph pool) have
 * indices after UNKNOWN_COLOR.
 */
export const CATEGORIES: ReadonlyArray<ICategory> = [
  { key: 'parameters', label: 'Parameters', color: 0 },
  { key: 'gradients', label: 'Gradients', color: 1 },
  { key: 'optimizer_state', label: 'Optimizer state', color: 2 },
  { key: 'optimizer_scratch', label: 'Optimizer scratch', color: 3 },
  { key: 'kv_cache', label: 'KV cache', color: 14 },
  { key: 'activations', label: 'Activations', color: 4 },
  { key: 'inputs', label: 'Inputs', color: 5 },
  { key: 'other', label: 'Other live tensors', color: 6 },
  { key: 'temporary', label: 'Temporaries', color: 7 },
  { key: 'unattributed', label: 'Unattributed blocks', color: 8 },
  { key: 'library_workspace', label: 'Library workspaces', color: 15 },
  { key: 'cuda_graph_pool', label: 'CUDA graph pool', color: 16 },
  { key: 'cache', label: 'Allocator cache', color: 9 },
  { key: 'cuda_context', label: 'CUDA context', color: 10 },
  { key: 'allocator_slack', label: 'Allocator slack', color: 11 },
  { key: 'communication', label: 'Communication buffers', color: 12 }
];

/** Display order and names of the breakdown categories. */
export const CATEGORY_LABELS: ReadonlyArray<[string, string]> = CATEGORIES.map(c => [
  c.key,
  c.label
]);

const BY_KEY = new Map(CATEGORIES.map(c => [c.key, c]));
const ORDER = CATEGORIES.map(c => c.key);

/** `"optimizer_state"` -> `"Optimizer state"`; unknown keys lose their underscores. */
export function categoryLabel(key: string): string {
  return BY_KEY.get(key)?.label ?? key.replace(/_/g, ' ');
}

/** The `jp-GpuMem-seg-N` index of a category: fixed, whichever others are present. */
export function categoryColor(key: string): number {
  return BY_KEY.get(key)?.color ?? UNKNOWN_COLOR;
}

/**
 * A breakdown as stacked-bar segments, in the fixed category order. Empty
 * categories are left out: a report of one GPU need not list communication buffers.
 */
export function breakdownSegments(breakdown: Record<string, number>): ISegment[] {
  const keys = [
    ...ORDER.filter(key => key in breakdown),
    ...Object.keys(breakdown)
      .filter(key => !BY_KEY.has(key))
      .sort()
  ].filter(key => breakdown[key] !== 0);
  return keys.map(key => ({
    key,
    label: categoryLabel(key),
    bytes: breakdown[key],
    color: categoryColor(key)
  }));
}

/**
 * The phases of the timeline, each coloured as the category it mostly allocates:
 * the forward pass makes activations, the backward pass gradients, the optimizer
 * step its state, and a decode step grows the KV cache. Prefill, the pass over the
 * prompt, takes the colour of inputs (its activations would be forward's green).
 */
export const PHASES: ReadonlyArray<ICategory> = [
  { key: 'forward', label: 'Forward', color: categoryColor('activations') },
  { key: 'backward', label: 'Backward', color: categoryColor('gradients') },
  { key: 'optimizer', label: 'Optimizer', color: categoryColor('optimizer_state') },
  { key: 'prefill', label: 'Prefill', color: categoryColor('inputs') },
  { key: 'decode', label: 'Decode', color: categoryColor('kv_cache') },
  { key: 'other', label: 'Other', color: UNKNOWN_COLOR }
];

/** The phase entry of a band's phase; unknown phases count as "other". */
export function phaseOf(phase: string): ICategory {
  return PHASES.find(p => p.key === phase) ?? PHASES[PHASES.length - 1];
}
