/**
 * Pure functions over a report's module tree (`IModuleNode`, report schema 3): totals and
 * own bytes, the names rows show, the icicle's layout and the tree's visible rows. The
 * components of modules.tsx keep only state (the zoomed node, the open rows) and draw
 * what these return.
 */
import { IBreakdown, IModuleNode } from '../wire';

/** What the root (path `""`) is called. */
export const ROOT_LABEL = 'model';

/** Rows the icicle draws below the zoomed node. */
export const ICICLE_LEVELS = 4;

/** A node narrower than this share of its parent is not drawn in the icicle. */
export const MIN_SHARE = 0.005;

/** A node narrower than this share of the zoomed node is not drawn either (under a pixel). */
export const MIN_WIDTH = 0.001;

/** A node's bytes, its children's included. */
export function totalBytes(node: IModuleNode): number {
  return Object.values(node.bytes).reduce((sum, n) => sum + n, 0);
}

/** The bytes by category of a node's own code: its children's taken out, nonzero only. */
export function ownBytes(node: IModuleNode): IBreakdown {
  const own: IBreakdown = { ...node.bytes };
  for (const child of node.children) {
    for (const [category, n] of Object.entries(child.bytes)) {
      own[category] = (own[category] ?? 0) - n;
    }
  }
  for (const category of Object.keys(own)) {
    if (own[category] === 0) {
      delete own[category];
    }
  }
  return own;
}

/** A node's own bytes in all: its total less its children's. */
export function ownTotal(node: IModuleNode): number {
  return node.children.reduce((rest, child) => rest - totalBytes(child), totalBytes(node));
}

/** `block#1` -> `block`: the module's name without the number of its call. */
function withoutCall(path: string): string {
  return path.replace(/#\d+$/, '');
}

/**
 * A module's name under its parent: `h.3` under `transformer`, `fc#0` under `block#0`; a
 * child of the root by its full path; the root `model`.
 */
export function moduleLabel(path: string, parentPath: string | null = null): string {
  if (!path) {
    return ROOT_LABEL;
  }
  const base = parentPath ? withoutCall(parentPath) : '';
  return base && path.startsWith(`${base}.`) ? path.slice(base.length + 1) : path;
}

/**
 * A module's name where it stands alone (the largest module, a tooltip): its path
 * (`transformer.h.3.attn`); the root `model`; `model.2` where the path starts with an index
 * (a Sequential's child), which alone would read as a number beside its bytes.
 */
export function moduleName(path: string): string {
  if (!path) {
    return ROOT_LABEL;
  }
  return /^\d/.test(path) ? `${ROOT_LABEL}.${path}` : path;
}

/** The nodes from the root down to the one at `path` (both included); null if none is. */
export function pathTo(root: IModuleNode, path: string): IModuleNode[] | null {
  if (root.path === path) {
    return [root];
  }
  for (const child of root.children) {
    const below = pathTo(child, path);
    if (below) {
      return [root, ...below];
    }
  }
  return null;
}

/** One drawn node of the icicle; `x0` and `x1` are shares of the zoomed node's width. */
export interface IIcicleCell {
  node: IModuleNode;
  /** The path of the node it is drawn under (null for the zoomed node). */
  parent: string | null;
  /** Rows below the zoomed node (0: the zoomed node itself). */
  depth: number;
  x0: number;
  x1: number;
}

export interface IIcicleLayout {
  cells: IIcicleCell[];
  /** Nodes within the drawn rows left out as too narrow (their subtrees not counted). */
  hidden: number;
}

/**
 * The icicle of `zoom`: the zoomed node across the full width on the first row, and below
 * each node its children side by side in the order they ran, each as wide as its share of
 * the parent's bytes; what the children leave of the parent's width is the parent's own
 * bytes. `levels` rows are drawn below the zoomed node; a child under `minShare` of its
 * parent, or under `minWidth` of the whole width, is left out (its place stays empty).
 */
export function icicleLayout(
  zoom: IModuleNode,
  options: { levels?: number; minShare?: number; minWidth?: number } = {}
): IIcicleLayout {
  const levels = options.levels ?? ICICLE_LEVELS;
  const minShare = options.minShare ?? MIN_SHARE;
  const minWidth = options.minWidth ?? MIN_WIDTH;
  const cells: IIcicleCell[] = [];
  let hidden = 0;
  const place = (
    node: IModuleNode,
    parent: string | null,
    depth: number,
    x0: number,
    width: number
  ) => {
    cells.push({ node, parent, depth, x0, x1: x0 + width });
    const total = totalBytes(node);
    if (depth >= levels || total <= 0) {
      return;
    }
    let x = x0;
    for (const child of node.children) {
      const share = Math.max(totalBytes(child), 0) / total;
      const w = width * share;
      if (share < minShare || w < minWidth) {
        hidden++;
      } else {
        place(child, node.path, depth + 1, x, w);
      }
      x += w;
    }
  };
  place(zoom, null, 0, 0, 1);
  return { cells, hidden };
}

/**
 * The node to zoom the icicle to so that `path` is drawn: the root when it lies within
 * `levels` rows of it, else its ancestor `levels` rows up. The root when `path` is unknown.
 */
export function zoomToShow(root: IModuleNode, path: string, levels = ICICLE_LEVELS): string {
  const chain = pathTo(root, path);
  if (!chain || chain.length - 1 <= levels) {
    return root.path;
  }
  return chain[chain.length - 1 - levels].path;
}

/** The zoom one step out of `path`: its parent's path (the root stays the root). */
export function zoomOut(root: IModuleNode, path: string): string {
  const chain = pathTo(root, path);
  return chain && chain.length > 1 ? chain[chain.length - 2].path : root.path;
}

/** One row of the collapsible tree. */
export interface ITreeRow {
  node: IModuleNode;
  /** 0 for the root. */
  depth: number;
  /** The name under its parent (`moduleLabel`). */
  label: string;
  open: boolean;
}

/** The rows of the tree whose every ancestor is in `open`, parents before their children. */
export function treeRows(root: IModuleNode, open: ReadonlySet<string>): ITreeRow[] {
  const rows: ITreeRow[] = [];
  const visit = (node: IModuleNode, parent: string | null, depth: number) => {
    const isOpen = node.children.length > 0 && open.has(node.path);
    rows.push({ node, depth, label: moduleLabel(node.path, parent), open: isOpen });
    if (isOpen) {
      for (const child of node.children) {
        visit(child, node.path, depth + 1);
      }
    }
  };
  visit(root, null, 0);
  return rows;
}

/** The rows open at first: the root and the modules right under it. */
export function initiallyOpen(root: IModuleNode): Set<string> {
  return new Set([root.path, ...root.children.map(c => c.path)]);
}

/** `open` with every ancestor of `path` added, so that its row shows. */
export function openTo(
  open: ReadonlySet<string>,
  root: IModuleNode,
  path: string
): Set<string> {
  const out = new Set(open);
  for (const node of (pathTo(root, path) ?? []).slice(0, -1)) {
    out.add(node.path);
  }
  return out;
}
