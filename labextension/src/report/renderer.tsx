/**
 * The rich view of a `%%gpumem` report (`application/vnd.jupyter-gpumem.report+json`).
 * Everything from the kernel is rendered as React text, never as HTML; the
 * report's own text/html stays the fallback where this extension is absent.
 */
import { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { ReactWidget } from '@jupyterlab/ui-components';
import * as React from 'react';

import { formatBytes, formatSeconds, unitPreference, Units } from '../format';
import { IReport, IReportDevice, parseReport, REPORT_MIME_TYPE, REPORT_SCHEMAS } from '../wire';
import { CacheCell, hasCache } from './cache';
import { breakdownSegments } from './categories';
import { LargestFreed, LeakHints, OomSection, TensorTable } from './findings';
import { ModuleSection } from './modules';
import { RankSection } from './ranks';
import { StackedBar } from './stackedbar';
import { TimelineChart } from './timeline';

export { breakdownSegments, CATEGORY_LABELS } from './categories';

/** A report device's id: `cuda:0`, `cpu` (older reports name only the index). */
export function deviceId(device: IReportDevice): string {
  return device.device ?? `cuda:${device.index}`;
}

function deviceLabel(device: IReportDevice): string {
  const id = deviceId(device);
  return device.name ? `${id} · ${device.name}` : id;
}

/** How the report's figures were measured, in the user's words (the wire's `source`). */
export const SOURCE_LABELS: Readonly<Record<string, { label: string; title: string }>> = {
  'allocator-trace': {
    label: 'allocator trace',
    title: "every allocation of PyTorch's CUDA caching allocator, traced"
  },
  counters: {
    label: 'peak counters',
    title: "the CUDA allocator's peak counters only (--no-trace): no breakdown"
  },
  'cpu-dispatch': {
    label: 'CPU tensors',
    title: 'no CUDA device: the memory of the CPU tensors the cell made'
  }
};

/** The header's note on how the figures were measured; none for `none` or no source. */
function SourceBadge(props: { source: string | null | undefined }): JSX.Element | null {
  const { source } = props;
  if (!source || source === 'none') {
    return null;
  }
  const known = SOURCE_LABELS[source];
  return (
    <span className="jp-GpuMem-reportMeta" title={known?.title}>
      {known?.label ?? source}
    </span>
  );
}

function peakAt(device: IReportDevice): string {
  const parts: string[] = [];
  if (device.peak_phase) {
    parts.push(device.peak_phase);
  }
  if (device.peak_step !== null) {
    parts.push(`step ${device.peak_step}`);
  }
  return parts.join(', ') || '–';
}

function Messages(props: { kind: 'warning' | 'note'; items: string[] }): JSX.Element | null {
  if (!props.items.length) {
    return null;
  }
  return (
    <ul className={`jp-GpuMem-messages jp-mod-${props.kind}`}>
      {props.items.map((text, i) => (
        <li key={i}>
          <span className="jp-GpuMem-messageKind">{props.kind === 'warning' ? 'Warning' : 'Note'}</span>{' '}
          {text}
        </li>
      ))}
    </ul>
  );
}

function DeviceRows(props: { devices: IReportDevice[]; units: Units }): JSX.Element {
  const { units } = props;
  // CPU devices alone: no reserved or cache columns at all.
  const cached = props.devices.some(hasCache);
  return (
    <table className="jp-GpuMem-table jp-GpuMem-reportTable">
      <thead>
        <tr>
          <th>Device</th>
          {/* Figures stand right-aligned, so do their headings: each over its own column. */}
          <th className="jp-GpuMem-num">Peak allocated</th>
          {cached && <th className="jp-GpuMem-num">Peak reserved</th>}
          {cached && <th className="jp-GpuMem-num">Cache</th>}
          <th className="jp-GpuMem-num">Δ allocated</th>
          <th>Peak at</th>
        </tr>
      </thead>
      <tbody>
        {props.devices.map(device => (
          <tr key={`${device.device ?? ''}:${device.index}`}>
            <td className="jp-GpuMem-deviceName">{deviceLabel(device)}</td>
            <td className="jp-GpuMem-num">{formatBytes(device.peak_allocated_bytes, units)}</td>
            {cached && (
              <CacheCell device={device} bytes={device.peak_reserved_bytes} units={units} />
            )}
            {cached && <CacheCell device={device} bytes={device.cache_bytes} units={units} />}
            <td className="jp-GpuMem-num">
              {device.allocated_delta_bytes !== null && device.allocated_delta_bytes !== undefined
                ? `${device.allocated_delta_bytes > 0 ? '+' : ''}${formatBytes(device.allocated_delta_bytes, units)}`
                : '–'}
            </td>
            <td>{peakAt(device)}</td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}

function Metric(props: { label: string; value: string; over?: boolean }): JSX.Element {
  return (
    <div className={props.over ? 'jp-GpuMem-metric jp-mod-over' : 'jp-GpuMem-metric'}>
      <div className="jp-GpuMem-metricLabel">{props.label}</div>
      <div className="jp-GpuMem-metricValue">{props.value}</div>
    </div>
  );
}

/**
 * One device's out-of-memory section, timeline, breakdown at the peak, the peak by module
 * (report schema 3) and tensors.
 */
function DeviceDetails(props: { device: IReportDevice; units: Units }): JSX.Element {
  const { device, units } = props;
  const id = deviceId(device);
  const alive = device.tensors.filter(t => t.alive);
  const freed = device.tensors.some(t => !t.alive);
  return (
    <>
      {device.oom && <OomSection oom={device.oom} device={id} units={units} />}
      {device.timeline && device.timeline.t_s.length > 1 && (
        <div className="jp-GpuMem-timelineSection">
          <div className="jp-GpuMem-sectionTitle">Memory over the cell on {id}</div>
          <TimelineChart
            timeline={device.timeline}
            units={units}
            label={`memory over the cell on ${deviceLabel(device)}`}
          />
        </div>
      )}
      {device.breakdown && Object.keys(device.breakdown).length ? (
        <div className="jp-GpuMem-breakdown">
          <div className="jp-GpuMem-sectionTitle">At the peak on {id}</div>
          <StackedBar
            segments={breakdownSegments(device.breakdown)}
            units={units}
            label={`breakdown of the peak on ${deviceLabel(device)}`}
          />
        </div>
      ) : null}
      {device.module_tree && (
        <ModuleSection
          tree={device.module_tree}
          largest={device.largest_module ?? null}
          device={id}
          label={deviceLabel(device)}
          units={units}
        />
      )}
      {(alive.length > 0 || freed) && (
        <div className="jp-GpuMem-tensors">
          <div className="jp-GpuMem-sectionTitle">Tensors the cell left alive on {id}</div>
          {alive.length > 0 ? (
            <TensorTable tensors={alive} units={units} />
          ) : (
            <div className="jp-GpuMem-reportEmpty">None.</div>
          )}
          <LargestFreed tensors={device.tensors} units={units} />
        </div>
      )}
    </>
  );
}

/**
 * The device the headline shows: the one the kernel names (the largest rise of its peak),
 * or the first device in reports saved before the kernel named one.
 */
export function mainDevice(report: IReport): IReportDevice | null {
  const named = report.devices.find(d => d.device === report.main_device);
  return named ?? report.devices[0] ?? null;
}

/**
 * The header's badge: the cell's status, unless the cell ran but its peak exceeded the
 * budget, which the badge then says (never a green "ok" beside an exceeded budget).
 */
export function statusBadge(report: IReport): { text: string; bad: boolean } {
  if (report.status !== 'ok') {
    return { text: report.status, bad: true };
  }
  return report.over_budget === true
    ? { text: 'over budget', bad: true }
    : { text: 'ok', bad: false };
}

/** The budget warning in the user's units, when the kernel said the peak exceeds it. */
export function budgetWarning(
  report: IReport,
  main: IReportDevice | null,
  units: Units
): string[] {
  const peak = main?.peak_allocated_bytes;
  const budget = report.budget_bytes;
  if (report.over_budget !== true || !main || typeof peak !== 'number' || !budget) {
    return [];
  }
  return [
    `peak ${formatBytes(peak, units)} on ${main.device} exceeds the budget of ` +
      `${formatBytes(budget, units)} by ${formatBytes(peak - budget, units)}`
  ];
}

/** A warning when the report's schema is newer than this extension reads. */
export function schemaWarning(report: IReport): string[] {
  const newest = Math.max(...REPORT_SCHEMAS);
  if (report.schema === undefined || report.schema <= newest) {
    return [];
  }
  const known = `${REPORT_SCHEMAS.slice(0, -1).join(', ')} and ${newest}`;
  return [
    `this report has schema ${report.schema}, newer than this extension reads ` +
      `(${known}): names it does not know show plainly; ` +
      'update jupyter-gpumem where JupyterLab runs'
  ];
}

/** The report as shown under a cell. */
export function ReportView(props: { report: IReport; units: Units }): JSX.Element {
  const { report, units } = props;
  const main = mainDevice(report);
  const overBudget = report.over_budget === true;
  const badge = statusBadge(report);
  const warnings = [
    ...budgetWarning(report, main, units),
    ...report.warnings,
    ...schemaWarning(report)
  ];
  return (
    <div className="jp-GpuMem-reportView" data-report-id={report.id}>
      <div className="jp-GpuMem-reportHeader">
        <span className="jp-GpuMem-reportTitle">
          %%gpumem{report.name ? ` ${report.name}` : ''}
        </span>
        <span className={`jp-GpuMem-status jp-mod-${badge.bad ? 'bad' : 'ok'}`}>{badge.text}</span>
        {report.wall_s !== null && (
          <span className="jp-GpuMem-reportMeta">{formatSeconds(report.wall_s)}</span>
        )}
        <SourceBadge source={report.source} />
      </div>
      {report.error && <div className="jp-GpuMem-reportError">{report.error}</div>}
      {!report.cuda_available && !report.devices.length && (
        <div className="jp-GpuMem-reportEmpty">No CUDA device was used by this cell.</div>
      )}
      {main && (
        <div className="jp-GpuMem-summary">
          <Metric label="Peak allocated" value={formatBytes(main.peak_allocated_bytes, units)} />
          {hasCache(main) && (
            <Metric label="Peak reserved" value={formatBytes(main.peak_reserved_bytes, units)} />
          )}
          {hasCache(main) && <Metric label="Cache" value={formatBytes(main.cache_bytes, units)} />}
          <Metric label="Wall time" value={formatSeconds(report.wall_s)} />
          {report.budget_bytes ? (
            <Metric
              label="Budget"
              value={`${formatBytes(report.budget_bytes, units)}${overBudget ? ' (exceeded)' : ''}`}
              over={overBudget}
            />
          ) : null}
        </div>
      )}
      {report.devices.length > 0 && <DeviceRows devices={report.devices} units={units} />}
      {report.devices.map(device => (
        <DeviceDetails
          key={`d:${deviceId(device)}:${device.index}`}
          device={device}
          units={units}
        />
      ))}
      {report.ranks?.length ? (
        <RankSection
          report={report}
          units={units}
          renderRank={rank => <ReportView report={rank} units={units} />}
        />
      ) : null}
      <LeakHints hints={report.leak_hints} units={units} />
      <Messages kind="warning" items={warnings} />
      <Messages kind="note" items={report.notes} />
    </div>
  );
}

/** The rendermime renderer: parses once, shows a plain message if the data is malformed. */
export class ReportRenderer extends ReactWidget implements IRenderMime.IRenderer {
  constructor(options: IRenderMime.IRendererOptions) {
    super();
    this._mimeType = options.mimeType;
    this.addClass('jp-GpuMem-report');
  }

  renderModel(model: IRenderMime.IMimeModel): Promise<void> {
    try {
      this._report = parseReport(model.data[this._mimeType]);
      this._error = null;
    } catch (error) {
      this._report = null;
      this._error = error instanceof Error ? error.message : String(error);
    }
    this.update();
    return Promise.resolve();
  }

  protected render(): JSX.Element {
    if (!this._report) {
      return (
        <div className="jp-GpuMem-reportError">
          Cannot show this %%gpumem report: {this._error ?? 'no data'}
        </div>
      );
    }
    return <ReportView report={this._report} units={unitPreference.units} />;
  }

  private _error: string | null = null;
  private _mimeType: string;
  private _report: IReport | null = null;
}

/** Preferred over the report's text/html (rank 50) and text/plain. */
export const RENDERER_RANK = 0;

export const rendererFactory: IRenderMime.IRendererFactory = {
  safe: true,
  mimeTypes: [REPORT_MIME_TYPE],
  defaultRank: RENDERER_RANK,
  createRenderer: options => new ReportRenderer(options)
};
