/**
 * The breakdown categories and training phases of a report: their display
 * names and their colours (`jp-GpuMem-seg-N` classes in style/base.css), shared
 * by the breakdown bar, the out-of-memory section and the timeline's bands.
 */
import { ISegment } from './charts';

/** Display order and names of the breakdown categories; unknown ones follow. */
export const CATEGORY_LABELS: ReadonlyArray<[string, string]> = [
  ['parameters', 'Parameters'],
  ['gradients', 'Gradients'],
  ['optimizer_state', 'Optimizer state'],
  ['optimizer_scratch', 'Optimizer scratch'],
  ['activations', 'Activations'],
  ['inputs', 'Inputs'],
  ['other', 'Other live tensors'],
  ['temporary', 'Temporaries'],
  ['unattributed', 'Unattributed blocks'],
  ['cache', 'Allocator cache'],
  ['cuda_context', 'CUDA context'],
  ['allocator_slack', 'Allocator slack'],
  ['communication', 'Communication buffers']
];

const LABELS = new Map(CATEGORY_LABELS);
const ORDER = CATEGORY_LABELS.map(([key]) => key);

/** Colour index of categories (and phases) this extension does not know. */
export const UNKNOWN_COLOR = 13;

/** `"optimizer_state"` -> `"Optimizer state"`; unknown keys lose their underscores. */
export function categoryLabel(key: string): string {
  return LABELS.get(key) ?? key.replace(/_/g, ' ');
}

/** The `jp-GpuMem-seg-N` index of a category: fixed, whichever others are present. */
export function categoryColor(key: string): number {
  return LABELS.has(key) ? ORDER.indexOf(key) : UNKNOWN_COLOR;
}

/**
 * A breakdown as stacked-bar segments, in the fixed category order. Empty
 * categories are left out: a report of one GPU need not list communication buffers.
 */
export function breakdownSegments(breakdown: Record<string, number>): ISegment[] {
  const keys = [
    ...ORDER.filter(key => key in breakdown),
    ...Object.keys(breakdown)
      .filter(key => !LABELS.has(key))
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
 * The training phases of the timeline, each coloured as the category it mostly
 * allocates: the forward pass makes activations, the backward pass gradients,
 * the optimizer step its state.
 */
export const PHASES: ReadonlyArray<{ key: string; label: string; color: number }> = [
  { key: 'forward', label: 'Forward', color: categoryColor('activations') },
  { key: 'backward', label: 'Backward', color: categoryColor('gradients') },
  { key: 'optimizer', label: 'Optimizer', color: categoryColor('optimizer_state') },
  { key: 'other', label: 'Other', color: UNKNOWN_COLOR }
];

/** The phase entry of a band's phase; unknown phases count as "other". */
export function phaseOf(phase: string): { key: string; label: string; color: number } {
  return PHASES.find(p => p.key === phase) ?? PHASES[PHASES.length - 1];
}
