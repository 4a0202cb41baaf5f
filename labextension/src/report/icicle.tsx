/**
 * The icicle of a report's module tree: the zoomed node across the full width, and below
 * it its modules a few levels deep, each as wide as its share of its parent and drawn as a
 * stacked bar of its categories. Clicking a node zooms into it; the top bar and the path
 * above zoom out. The layout is `icicleLayout` (moduletree.ts).
 */
import * as React from 'react';

import { formatBytes, Units } from '../format';
import { IBreakdown, IModuleNode } from '../wire';
import { breakdownSegments } from './categories';
import {
  icicleLayout,
  IIcicleCell,
  MIN_SHARE,
  moduleLabel,
  moduleName,
  ownTotal,
  pathTo,
  totalBytes,
  zoomOut
} from './moduletree';

const ROW_H = 20;
/** Roughly the width of a label's character, to decide whether a label fits its cell. */
const CHAR_W = 6.4;
const LABEL_PAD = 4;
/** The width assumed until the icicle is measured (and where it cannot be, as in tests). */
const DEFAULT_WIDTH = 720;

/** A share as an SVG or CSS percentage. */
export function percent(share: number): string {
  return `${(share * 100).toFixed(3)}%`;
}

/** What a node holds, for hover titles: `transformer.h.0 · 23.3 MiB (activations 21 MiB, ...)`. */
export function moduleTitle(node: IModuleNode, units: Units): string {
  const parts = breakdownSegments(node.bytes).map(
    s => `${s.label.toLowerCase()} ${formatBytes(s.bytes, units)}`
  );
  const own = ownTotal(node);
  const ownText = node.children.length ? `; own ${formatBytes(own, units)}` : '';
  return (
    `${moduleName(node.path)} · ${formatBytes(totalBytes(node), units)}` +
    `${parts.length ? ` (${parts.join(', ')})` : ''}${ownText}`
  );
}

/** The label that fits a cell of `px` pixels: name and bytes, the name alone, or nothing. */
export function cellLabel(name: string, bytes: string, px: number): string {
  const fits = (text: string) => text.length * CHAR_W + 2 * LABEL_PAD <= px;
  const both = `${name} · ${bytes}`;
  return fits(both) ? both : fits(name) ? name : '';
}

/** The categories of `bytes` as rectangles side by side, in shares of the enclosing SVG. */
function CategoryRects(props: { bytes: IBreakdown }): JSX.Element {
  const segments = breakdownSegments(props.bytes).filter(s => s.bytes > 0);
  const total = segments.reduce((sum, s) => sum + s.bytes, 0);
  let x = 0;
  return (
    <>
      {segments.map(s => {
        const w = total > 0 ? s.bytes / total : 0;
        const rect = (
          <rect
            key={s.key}
            className={`jp-GpuMem-iceSeg jp-GpuMem-seg-${s.color}`}
            x={percent(x)}
            y={0}
            width={percent(w)}
            height="100%"
          />
        );
        x += w;
        return rect;
      })}
    </>
  );
}

/** The width of an element, followed as it changes (a fixed guess where it cannot be read). */
function useWidth(ref: React.RefObject<Element>): number {
  const [width, setWidth] = React.useState(DEFAULT_WIDTH);
  React.useEffect(() => {
    const element = ref.current;
    if (!element) {
      return;
    }
    const read = () => {
      const w = element.getBoundingClientRect().width;
      if (w > 0) {
        setWidth(w);
      }
    };
    read();
    if (typeof ResizeObserver === 'undefined') {
      return;
    }
    const observer = new ResizeObserver(read);
    observer.observe(element);
    return () => observer.disconnect();
  }, [ref]);
  return width;
}

function IcicleCell(props: {
  cell: IIcicleCell;
  px: number;
  highlight: boolean;
  units: Units;
  onClick: () => void;
}): JSX.Element {
  const { cell, units } = props;
  const name = moduleLabel(cell.node.path, cell.parent);
  const label = cellLabel(name, formatBytes(totalBytes(cell.node), units), props.px);
  const className = [
    'jp-GpuMem-iceCell',
    cell.depth === 0 ? 'jp-mod-zoomed' : '',
    props.highlight ? 'jp-mod-highlight' : ''
  ]
    .filter(Boolean)
    .join(' ');
  return (
    <g className={className} data-path={cell.node.path} onClick={props.onClick}>
      <title>{moduleTitle(cell.node, units)}</title>
      <svg
        x={percent(cell.x0)}
        y={cell.depth * ROW_H}
        width={percent(cell.x1 - cell.x0)}
        height={ROW_H}
      >
        <CategoryRects bytes={cell.node.bytes} />
        <rect className="jp-GpuMem-iceEdge" x={0} y={0} width="100%" height="100%" />
        {label && (
          <text className="jp-GpuMem-iceLabel" x={LABEL_PAD} y={ROW_H / 2} dy="0.35em">
            {label}
          </text>
        )}
      </svg>
    </g>
  );
}

/**
 * The icicle of the node at `zoom`: clicking a node below zooms into it, clicking the top
 * row (or a crumb of the path above) zooms out.
 */
export function Icicle(props: {
  root: IModuleNode;
  zoom: string;
  onZoom: (path: string) => void;
  highlight: string | null;
  units: Units;
  label: string;
}): JSX.Element {
  const { root, units } = props;
  const ref = React.useRef<HTMLDivElement>(null);
  const width = useWidth(ref);
  const chain = pathTo(root, props.zoom) ?? [root];
  const zoomed = chain[chain.length - 1];
  const { cells, hidden } = icicleLayout(zoomed);
  const rows = Math.max(...cells.map(c => c.depth)) + 1;
  return (
    <div className="jp-GpuMem-icicle" ref={ref}>
      <div className="jp-GpuMem-iceCrumbs">
        {chain.map((node, i) => {
          const name = moduleLabel(node.path, i > 0 ? chain[i - 1].path : null);
          const last = i === chain.length - 1;
          return (
            <React.Fragment key={node.path}>
              {i > 0 && <span className="jp-GpuMem-iceCrumbSep">›</span>}
              {last ? (
                <span className="jp-GpuMem-iceCrumb jp-mod-current" title={node.path || name}>
                  {name}
                </span>
              ) : (
                <button
                  className="jp-GpuMem-iceCrumb"
                  title={`Zoom out to ${node.path || name}`}
                  onClick={() => props.onZoom(node.path)}
                >
                  {name}
                </button>
              )}
            </React.Fragment>
          );
        })}
        <span className="jp-GpuMem-iceHint">
          click a module to zoom in, the top bar to zoom out
          {hidden
            ? ` · ${hidden === 1 ? 'one module' : `${hidden} modules`} under ` +
              `${MIN_SHARE * 100}% of ${hidden === 1 ? 'its' : 'their'} parent not drawn`
            : ''}
        </span>
      </div>
      <svg
        className="jp-GpuMem-iceSvg"
        width="100%"
        height={rows * ROW_H}
        role="img"
        aria-label={props.label}
      >
        {cells.map(cell => (
          <IcicleCell
            key={cell.node.path}
            cell={cell}
            px={(cell.x1 - cell.x0) * width}
            highlight={cell.node.path === props.highlight}
            units={units}
            onClick={() =>
              props.onZoom(
                cell.depth === 0 ? zoomOut(root, cell.node.path) : cell.node.path
              )
            }
          />
        ))}
      </svg>
    </div>
  );
}

