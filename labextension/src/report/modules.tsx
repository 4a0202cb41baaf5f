/**
 * A report's peak by module (report schema 3): the icicle of the module tree (icicle.tsx)
 * and a collapsible tree with each module's bytes, a bar of them on the model's scale and
 * its own bytes. The layout is in moduletree.ts; this file keeps the state and draws the tree.
 *
 * The sidebar asks a section to show one module (`showModule`) by a DOM event on the
 * section's element: the report renderer and the sidebar are separate extensions.
 */
import * as React from 'react';

import { formatBytes, Units } from '../format';
import { IBreakdown, ILargestModule, IModuleNode } from '../wire';
import { breakdownSegments } from './categories';
import { Icicle, percent } from './icicle';
import {
  ICICLE_LEVELS,
  initiallyOpen,
  moduleName,
  openTo,
  ownTotal,
  pathTo,
  totalBytes,
  treeRows,
  zoomToShow
} from './moduletree';

/** The event a module section listens to: `detail.path` is the module to show. */
export const SHOW_MODULE_EVENT = 'jp-gpumem-show-module';

/** A module of one report's device, as the sidebar names it. */
export interface IModuleTarget {
  /** The report's id, to tell apart several reports of one cell. */
  reportId?: string;
  device: string;
  path: string;
}

/**
 * Ask the module section of `target.device` in the report `target.reportId` (else the
 * first report) under `host` to open its tree to `target.path`, zoom to it and mark it.
 * Returns whether such a section was found.
 */
export function showModule(host: Element, target: IModuleTarget): boolean {
  const views = Array.from(host.querySelectorAll<HTMLElement>('.jp-GpuMem-reportView'));
  const view = views.find(v => v.dataset.reportId === target.reportId) ?? views[0];
  if (!view) {
    return false;
  }
  const section = Array.from(view.querySelectorAll<HTMLElement>('.jp-GpuMem-modules')).find(
    s => s.dataset.device === target.device && s.closest('.jp-GpuMem-reportView') === view
  );
  if (!section) {
    return false;
  }
  section.dispatchEvent(new CustomEvent(SHOW_MODULE_EVENT, { detail: { path: target.path } }));
  return true;
}

/** The categories a tree holds, as swatches (the key of the icicle and the tree's bars). */
function ModuleLegend(props: { bytes: IBreakdown }): JSX.Element {
  return (
    <div className="jp-GpuMem-moduleLegend">
      {breakdownSegments(props.bytes)
        .filter(s => s.bytes > 0)
        .map(s => (
          <span key={s.key} className="jp-GpuMem-legendItem">
            <span className={`jp-GpuMem-swatch jp-GpuMem-seg-${s.color}`} />
            {s.label}
          </span>
        ))}
    </div>
  );
}

/** A module's bytes as a bar on the scale of `scale` bytes, its categories side by side. */
function ModuleBar(props: { bytes: IBreakdown; scale: number }): JSX.Element {
  const segments = breakdownSegments(props.bytes).filter(s => s.bytes > 0);
  const total = segments.reduce((sum, s) => sum + s.bytes, 0);
  const share = props.scale > 0 ? Math.min(total / props.scale, 1) : 0;
  return (
    <div className="jp-GpuMem-moduleBarTrack">
      <div className="jp-GpuMem-moduleBar" style={{ width: percent(share) }}>
        {segments.map(s => (
          <div
            key={s.key}
            className={`jp-GpuMem-seg jp-GpuMem-seg-${s.color}`}
            style={{ width: percent(s.bytes / total) }}
          />
        ))}
      </div>
    </div>
  );
}

/** The collapsible tree: the open rows of `open`, toggled by their triangles or names. */
export function ModuleTree(props: {
  root: IModuleNode;
  open: ReadonlySet<string>;
  onToggle: (path: string) => void;
  highlight: string | null;
  units: Units;
}): JSX.Element {
  const { root, units } = props;
  const scale = totalBytes(root);
  const marked = React.useRef<HTMLDivElement>(null);
  React.useEffect(() => {
    marked.current?.scrollIntoView?.({ block: 'nearest' });
  }, [props.highlight]);
  return (
    <div className="jp-GpuMem-moduleTree" role="tree">
      <div className="jp-GpuMem-moduleRow jp-mod-header" aria-hidden="true">
        <span>Module</span>
        <span>Share of the peak</span>
        <span className="jp-GpuMem-num">Bytes</span>
        <span className="jp-GpuMem-num">Own</span>
      </div>
      {treeRows(root, props.open).map(row => {
        const { node } = row;
        const parent = node.children.length > 0;
        const highlight = node.path === props.highlight;
        return (
          <div
            key={node.path}
            ref={highlight ? marked : undefined}
            className={`jp-GpuMem-moduleRow${highlight ? ' jp-mod-highlight' : ''}`}
            role="treeitem"
            aria-level={row.depth + 1}
            aria-expanded={parent ? row.open : undefined}
            data-path={node.path}
          >
            <span className="jp-GpuMem-moduleName" style={{ paddingLeft: `${row.depth * 14}px` }}>
              {parent ? (
                <button
                  className="jp-GpuMem-moduleToggle"
                  aria-label={`${row.open ? 'Close' : 'Open'} ${node.path || row.label}`}
                  onClick={() => props.onToggle(node.path)}
                >
                  {row.open ? '▾' : '▸'}
                </button>
              ) : (
                <span className="jp-GpuMem-moduleToggle" />
              )}
              <span
                className="jp-GpuMem-moduleLabel"
                title={node.path || row.label}
                onClick={parent ? () => props.onToggle(node.path) : undefined}
              >
                {row.label}
              </span>
            </span>
            <ModuleBar bytes={node.bytes} scale={scale} />
            <span className="jp-GpuMem-num">{formatBytes(totalBytes(node), units)}</span>
            <span className="jp-GpuMem-num jp-GpuMem-moduleOwn">
              {formatBytes(ownTotal(node), units)}
            </span>
          </div>
        );
      })}
    </div>
  );
}

/**
 * One device's peak by module: the largest module, the icicle and the tree. Listens for
 * `SHOW_MODULE_EVENT` to open, zoom to and mark a module.
 */
export function ModuleSection(props: {
  tree: IModuleNode;
  largest: ILargestModule | null;
  /** The device's id (`cuda:0`), as `showModule` names it. */
  device: string;
  /** The device as the section's title names it. */
  label: string;
  units: Units;
}): JSX.Element {
  const { tree, units } = props;
  const ref = React.useRef<HTMLDivElement>(null);
  const [zoom, setZoom] = React.useState(tree.path);
  const [open, setOpen] = React.useState<ReadonlySet<string>>(() => initiallyOpen(tree));
  const [highlight, setHighlight] = React.useState<string | null>(null);

  const show = React.useCallback(
    (path: string) => {
      if (!pathTo(tree, path)) {
        return;
      }
      setOpen(o => openTo(o, tree, path));
      setZoom(zoomToShow(tree, path, ICICLE_LEVELS));
      setHighlight(path);
    },
    [tree]
  );
  React.useEffect(() => {
    const element = ref.current;
    if (!element) {
      return;
    }
    const listener = (event: Event) => {
      const path = (event as CustomEvent<{ path?: unknown }>).detail?.path;
      if (typeof path === 'string') {
        show(path);
      }
    };
    element.addEventListener(SHOW_MODULE_EVENT, listener);
    return () => element.removeEventListener(SHOW_MODULE_EVENT, listener);
  }, [show]);

  const toggle = (path: string) =>
    setOpen(o => {
      const out = new Set(o);
      if (!out.delete(path)) {
        out.add(path);
      }
      return out;
    });

  const largest = props.largest;
  return (
    <div className="jp-GpuMem-modules" data-device={props.device} ref={ref}>
      <div className="jp-GpuMem-sectionTitle">At the peak on {props.device}, by module</div>
      {largest && (
        <div className="jp-GpuMem-largestModule">
          <span className="jp-GpuMem-findingLabel">Largest module (own bytes):</span>{' '}
          <button
            className="jp-GpuMem-moduleLink"
            title={`Show ${moduleName(largest.path)} in the tree`}
            onClick={() => show(largest.path)}
          >
            {moduleName(largest.path)}
          </button>{' '}
          {formatBytes(largest.bytes, units)}
        </div>
      )}
      <Icicle
        root={tree}
        zoom={zoom}
        onZoom={setZoom}
        highlight={highlight}
        units={units}
        label={`the peak on ${props.label} by module`}
      />
      <ModuleLegend bytes={tree.bytes} />
      <ModuleTree
        root={tree}
        open={open}
        onToggle={toggle}
        highlight={highlight}
        units={units}
      />
    </div>
  );
}
