/**
 * What a report found besides the numbers: the tensors a cell left alive (and
 * the largest it freed), what was live when it ran out of memory, and leak
 * hints. Every string comes from the kernel and is rendered as React text
 * (code spans of hint texts as <code> elements), never as HTML.
 */
import * as React from 'react';

import { formatBytes, UNKNOWN, Units } from '../format';
import { ILeakHint, IOomInfo, ITensorRecord } from '../wire';
import { breakdownSegments, categoryLabel } from './categories';
import { StackedBar } from './stackedbar';

/**
 * Longer names are shortened from the left, keeping their end (what tells
 * `...layers.11.mlp.weight]['exp_avg']` from its neighbours); up to it the name
 * column takes the room it needs (as the report's own HTML does).
 */
export const MAX_NAME_CHARS = 120;
/** Rows shown before the table sums up the rest. */
export const MAX_TENSOR_ROWS = 12;

/** `"opt.state[model.0.weight]['exp_avg_sq']"` -> `"…0.weight]['exp_avg_sq']"` past `max`. */
export function shortName(name: string, max = MAX_NAME_CHARS): string {
  if (name.length <= max) {
    return name;
  }
  return `…${name.slice(name.length - (max - 1))}`;
}

/** Where a name may wrap when its column is too narrow: after `.` and `]`, before `[`. */
const NAME_BREAK = /(?<=[.\]])|(?=\[)/;

/** `"a.b[c]"` as text with line break opportunities (<wbr>): `a.`, `b`, `[c]`. */
function breakable(name: string): React.ReactNode {
  return name.split(NAME_BREAK).map((part, i) => (
    <React.Fragment key={i}>
      {i > 0 && <wbr />}
      {part}
    </React.Fragment>
  ));
}

/** Code spans in hint texts, as the kernel writes them: `` `%gpumem free` ``. */
const CODE_SPAN = /`([^`\n]+)`/;

/**
 * `"Run `%gpumem free`."` -> `Run <code>%gpumem free</code>.`, as React nodes:
 * the rest stays text, so nothing in it is ever read as HTML.
 */
export function withCode(text: string): React.ReactNode {
  // split() with a capturing group: the code spans are the odd parts.
  return text.split(CODE_SPAN).map((part, i) =>
    i % 2 ? <code key={i}>{part}</code> : <React.Fragment key={i}>{part}</React.Fragment>
  );
}

/** `[8, 1024]` -> `"8×1024"`; `[]` -> `"scalar"`; unknown -> `"–"`. */
export function formatShape(shape: number[] | null): string {
  if (shape === null) {
    return UNKNOWN;
  }
  return shape.length ? shape.join('×') : 'scalar';
}

function TensorName(props: { name: string | null }): JSX.Element {
  const name = props.name ?? '(unnamed)';
  return (
    <td
      className={`jp-GpuMem-tensorName${props.name === null ? ' jp-mod-unnamed' : ''}`}
      title={name}
    >
      {breakable(shortName(name))}
    </td>
  );
}

/** Name, shape, dtype, bytes and line of each tensor, the largest first. */
export function TensorTable(props: { tensors: ITensorRecord[]; units: Units }): JSX.Element {
  const { units } = props;
  const sorted = [...props.tensors].sort((a, b) => (b.nbytes ?? 0) - (a.nbytes ?? 0));
  const shown = sorted.slice(0, MAX_TENSOR_ROWS);
  const rest = sorted.slice(MAX_TENSOR_ROWS);
  return (
    <table className="jp-GpuMem-table jp-GpuMem-tensorTable">
      <thead>
        <tr>
          <th>Name</th>
          <th>Shape</th>
          <th>Dtype</th>
          <th className="jp-GpuMem-num">Bytes</th>
          <th>Line</th>
        </tr>
      </thead>
      <tbody>
        {shown.map((t, i) => (
          <tr key={i} className="jp-GpuMem-tensor">
            <TensorName name={t.name} />
            <td className="jp-GpuMem-code">{formatShape(t.shape)}</td>
            <td className="jp-GpuMem-code">{t.dtype ?? UNKNOWN}</td>
            <td className="jp-GpuMem-num">{formatBytes(t.nbytes, units)}</td>
            <td className="jp-GpuMem-code">{t.line ?? UNKNOWN}</td>
          </tr>
        ))}
        {rest.length > 0 && (
          <tr className="jp-GpuMem-tensorMore">
            <td colSpan={3}>
              … {rest.length} more {rest.length === 1 ? 'tensor' : 'tensors'}
            </td>
            <td className="jp-GpuMem-num">
              {formatBytes(
                rest.reduce((s, t) => s + (t.nbytes ?? 0), 0),
                units
              )}
            </td>
            <td />
          </tr>
        )}
      </tbody>
    </table>
  );
}

/** The largest tensor the cell freed, in one line; null when it freed none worth listing. */
export function LargestFreed(props: {
  tensors: ITensorRecord[];
  units: Units;
}): JSX.Element | null {
  const freed = props.tensors.filter(t => !t.alive);
  if (!freed.length) {
    return null;
  }
  const largest = freed.reduce((best, t) => ((t.nbytes ?? 0) > (best.nbytes ?? 0) ? t : best));
  const what = [
    largest.name,
    largest.shape !== null ? formatShape(largest.shape) : null,
    largest.dtype
  ].filter((part): part is string => !!part);
  return (
    <div className="jp-GpuMem-largestFreed">
      <span className="jp-GpuMem-findingLabel">Largest freed:</span>{' '}
      {formatBytes(largest.nbytes, props.units)}
      {what.length ? ` (${what.join(' ')})` : ''} from {largest.line ?? 'an unknown line'}
    </div>
  );
}

/** Why the cell ran out of memory on one device, and what would help most. */
export function OomSection(props: { oom: IOomInfo; device: string; units: Units }): JSX.Element {
  const { oom, units } = props;
  return (
    <section className="jp-GpuMem-oom" aria-label={`out of memory on ${props.device}`}>
      <div className="jp-GpuMem-sectionTitle jp-GpuMem-oomTitle">
        Out of memory on {props.device}, asking for {formatBytes(oom.requested_bytes, units)}
      </div>
      {oom.dominant && (
        <div className="jp-GpuMem-oomDominant">
          <span className="jp-GpuMem-findingLabel">Most of what was live:</span>{' '}
          {categoryLabel(oom.dominant)}
          {oom.breakdown && oom.dominant in oom.breakdown
            ? ` (${formatBytes(oom.breakdown[oom.dominant], units)})`
            : ''}
        </div>
      )}
      {oom.advice && (
        <div className="jp-GpuMem-oomAdvice">
          <span className="jp-GpuMem-findingLabel">Try:</span> {withCode(oom.advice)}
        </div>
      )}
      {oom.breakdown && Object.keys(oom.breakdown).length > 0 && (
        <StackedBar
          segments={breakdownSegments(oom.breakdown)}
          units={units}
          label={`what was live when ${props.device} ran out of memory`}
        />
      )}
      {oom.largest.length > 0 && (
        <>
          <div className="jp-GpuMem-subTitle">Largest live tensors</div>
          <TensorTable tensors={oom.largest} units={units} />
        </>
      )}
    </section>
  );
}

/**
 * A hint's message with its byte amounts in the user's units; the kernel's binary-unit
 * message for reports saved before hints carried a template.
 */
export function hintMessage(hint: ILeakHint, units: Units): string {
  const amounts = hint.amounts ?? {};
  if (!hint.template) {
    return hint.message;
  }
  return hint.template.replace(/\{\{|\}\}|\{(\w+)\}/g, (match, name?: string) => {
    if (name === undefined) {
      return match[0]; // an escaped brace
    }
    const bytes = Object.prototype.hasOwnProperty.call(amounts, name) ? amounts[name] : null;
    return bytes === null ? match : formatBytes(bytes, units);
  });
}

/** Memory held for a fixable reason: what and how much, then the fix. */
export function LeakHints(props: { hints: ILeakHint[]; units: Units }): JSX.Element | null {
  if (!props.hints.length) {
    return null;
  }
  return (
    <section className="jp-GpuMem-leaks">
      <div className="jp-GpuMem-sectionTitle">Memory held after the cell</div>
      <ul className="jp-GpuMem-leakList">
        {props.hints.map((hint, i) => (
          <li key={i} className="jp-GpuMem-leak">
            <div className="jp-GpuMem-leakMessage">
              <span className="jp-GpuMem-leakKind">{hint.kind}</span>
              {hint.bytes !== null && (
                <span className="jp-GpuMem-leakBytes">{formatBytes(hint.bytes, props.units)}</span>
              )}
              {withCode(hintMessage(hint, props.units))}
            </div>
            {hint.fix && (
              <div className="jp-GpuMem-leakFix">
                <span className="jp-GpuMem-findingLabel">Fix:</span> {withCode(hint.fix)}
              </div>
            )}
            {hint.where.length > 0 && (
              <div className="jp-GpuMem-leakWhere">
                held by{' '}
                {hint.where.map((w, j) => (
                  <React.Fragment key={j}>
                    {j > 0 && ', '}
                    <code>{w}</code>
                  </React.Fragment>
                ))}
              </div>
            )}
          </li>
        ))}
      </ul>
    </section>
  );
}
