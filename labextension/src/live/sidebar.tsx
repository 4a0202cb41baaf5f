/**
 * The GPU memory sidebar: a card per device (gauge, sparkline, processes with
 * the active kernel's highlighted), the active kernel's host memory, and the
 * `%%gpumem` reports of the active notebook. Without a GPU it says why, and the
 * kernel's host memory and the CPU reports carry the panel. All server and
 * kernel text is rendered as React text.
 */
import { ReactWidget } from '@jupyterlab/ui-components';
import { Message } from '@lumino/messaging';
import * as React from 'react';

import {
  formatBytes,
  formatPercent,
  formatSeconds,
  UNKNOWN,
  Units
} from '../format';
import { IReportEntry, NotebookReports } from '../notebook';
import { deviceId, IModuleTarget, mainDevice, moduleName } from '../report';
import { IDevice, IKernelHost, IKernelProcesses, IProcess, ISample } from '../wire';
import { Gauge, Sparkline } from './charts';
import { GpuModel, IPoint } from './model';
import { STARTING_REASON, whyNoGpu } from './nogpu';

/** Everything the sidebar shows, as plain data (what the tests render). */
export interface ISidebarProps {
  sample: ISample | null;
  error: string | null;
  series: (deviceIndex: number) => IPoint[];
  window_s: number;
  kernelPids: ReadonlySet<number>;
  kernelProcesses: IKernelProcesses | null;
  /** The active notebook's kernel, when it has one. */
  kernelId: string | null;
  kernelHost: IKernelHost | null;
  notebookTitle: string | null;
  reports: ReadonlyArray<IReportEntry>;
  /** Show a report's cell; with `module`, that module in the report's tree. */
  onReveal: (entry: IReportEntry, module?: IModuleTarget) => void;
  units: Units;
}

/** A value, or a dash with the reason NVML gave for not having it. */
function Known(props: { text: string; reason?: string }): JSX.Element {
  if (props.text !== UNKNOWN || !props.reason) {
    return <>{props.text}</>;
  }
  return (
    <span className="jp-GpuMem-unknown" title={props.reason}>
      {UNKNOWN} ({props.reason})
    </span>
  );
}

function ProcessTable(props: {
  processes: IProcess[];
  kernelPids: ReadonlySet<number>;
  units: Units;
}): JSX.Element {
  if (!props.processes.length) {
    return <div className="jp-GpuMem-empty">No processes on this device.</div>;
  }
  const rows = [...props.processes].sort(
    (a, b) => (b.memory_bytes ?? -1) - (a.memory_bytes ?? -1) || a.pid - b.pid
  );
  return (
    <table className="jp-GpuMem-table jp-GpuMem-processes">
      <thead>
        <tr>
          <th>PID</th>
          <th>Command</th>
          <th className="jp-GpuMem-num">Memory</th>
        </tr>
      </thead>
      <tbody>
        {rows.map(p => {
          const mine = props.kernelPids.has(p.pid);
          return (
            <tr
              key={p.pid}
              className={mine ? 'jp-GpuMem-process jp-mod-kernel' : 'jp-GpuMem-process'}
              title={mine ? "this notebook's kernel" : undefined}
            >
              <td className="jp-GpuMem-num">{p.pid}</td>
              <td className="jp-GpuMem-command">
                {p.command ?? UNKNOWN}
                {mine && <span className="jp-GpuMem-badge">this notebook</span>}
              </td>
              <td className="jp-GpuMem-num">{formatBytes(p.memory_bytes, props.units)}</td>
            </tr>
          );
        })}
      </tbody>
    </table>
  );
}

export function DeviceCard(props: {
  device: IDevice;
  points: IPoint[];
  window_s: number;
  kernelPids: ReadonlySet<number>;
  units: Units;
}): JSX.Element {
  const { device, units } = props;
  const reasons = device.reasons;
  const stats: JSX.Element[] = [
    <span key="util">
      util <Known text={formatPercent(device.utilization_percent)} reason={reasons.utilization_percent} />
    </span>
  ];
  if (device.temperature_c !== null) {
    stats.push(<span key="temp">{device.temperature_c} °C</span>);
  }
  if (device.power_w !== null) {
    stats.push(<span key="power">{Math.round(device.power_w)} W</span>);
  }
  return (
    <div className="jp-GpuMem-card" data-device-index={device.index}>
      <div className="jp-GpuMem-cardHeader">
        <span className="jp-GpuMem-cardIndex">GPU {device.index}</span>
        <span className="jp-GpuMem-cardName" title={device.name ?? undefined}>
          {device.name ?? UNKNOWN}
        </span>
        {device.is_mig && (
          <span className="jp-GpuMem-badge">
            MIG{device.parent_index !== null ? ` of GPU ${device.parent_index}` : ''}
          </span>
        )}
      </div>
      <Gauge
        used={device.memory_used_bytes}
        total={device.memory_total_bytes}
        units={units}
        label={`GPU ${device.index} memory used`}
      />
      {device.memory_used_bytes === null && reasons.memory_used_bytes && (
        <div className="jp-GpuMem-unknown">memory used unknown: {reasons.memory_used_bytes}</div>
      )}
      <div className="jp-GpuMem-stats">{stats}</div>
      <Sparkline
        points={props.points}
        total={device.memory_total_bytes}
        window_s={props.window_s}
        units={units}
      />
      <ProcessTable processes={device.processes} kernelPids={props.kernelPids} units={units} />
    </div>
  );
}

/** The peak of a report's main device (as the kernel named it), and whether it was the CPU. */
export function peakOf(entry: IReportEntry): { bytes: number | null; cpu: boolean } {
  const main = mainDevice(entry.report);
  return { bytes: main?.peak_allocated_bytes ?? null, cpu: main?.device === 'cpu' };
}

/**
 * The largest module (by its own bytes) of a report's main device, where the report
 * has the peak by module (schema 3).
 */
export function largestModuleOf(
  entry: IReportEntry
): { device: string; path: string; bytes: number } | null {
  const main = mainDevice(entry.report);
  const largest = main?.largest_module;
  return main && largest ? { device: deviceId(main), ...largest } : null;
}

/**
 * The resident host memory of the active notebook's kernel (its process tree),
 * against the machine's memory. The only live gauge when there is no GPU.
 */
export function KernelHostSection(props: {
  host: IKernelHost | null;
  kernelId: string | null;
  notebookTitle: string | null;
  units: Units;
}): JSX.Element | null {
  const { host, units } = props;
  let body: JSX.Element;
  if (props.notebookTitle === null) {
    return null;
  } else if (!props.kernelId) {
    body = <div className="jp-GpuMem-empty">This notebook has no running kernel.</div>;
  } else if (!host) {
    body = <div className="jp-GpuMem-empty">Reading the kernel's memory…</div>;
  } else if (host.rss_bytes === null) {
    body = (
      <div className="jp-GpuMem-unknown">
        Host memory unknown{host.reason ? `: ${host.reason}` : ''}
      </div>
    );
  } else {
    const children = host.pids.filter(p => p !== host.pid).length;
    const available =
      host.host_available_bytes !== null
        ? ` · ${formatBytes(host.host_available_bytes, units)} available on this machine`
        : '';
    body = (
      <>
        <Gauge
          used={host.rss_bytes}
          total={host.host_total_bytes}
          units={units}
          label="kernel host memory (RSS)"
          ofTotal
        />
        <div className="jp-GpuMem-hostDetail">
          pid {host.pid ?? UNKNOWN}
          {children > 0 ? ` and ${children} child process${children === 1 ? '' : 'es'}` : ''}
          {available}
        </div>
      </>
    );
  }
  return (
    <section className="jp-GpuMem-section jp-GpuMem-host">
      <div className="jp-GpuMem-sectionTitle">Kernel host memory (RSS)</div>
      {body}
    </section>
  );
}

/** Why there is no GPU view, and what still works. */
function NoGpu(props: { reason: string | null }): JSX.Element {
  return (
    <div className="jp-GpuMem-noGpu">
      <div className="jp-GpuMem-unavailable">
        <span className="jp-GpuMem-unavailableTitle">NVML unavailable</span>
        <span className="jp-GpuMem-reason">{props.reason ?? 'unknown reason'}</span>
      </div>
      <p className="jp-GpuMem-noGpuHelp">{whyNoGpu(props.reason)}</p>
    </div>
  );
}

function ReportList(props: {
  notebookTitle: string | null;
  reports: ReadonlyArray<IReportEntry>;
  onReveal: (entry: IReportEntry, module?: IModuleTarget) => void;
  units: Units;
}): JSX.Element {
  return (
    <section className="jp-GpuMem-section jp-GpuMem-reports">
      <div className="jp-GpuMem-sectionTitle">
        %%gpumem reports{props.notebookTitle ? ` · ${props.notebookTitle}` : ''}
      </div>
      {props.notebookTitle === null ? (
        <div className="jp-GpuMem-empty">Open a notebook to see its reports.</div>
      ) : !props.reports.length ? (
        <div className="jp-GpuMem-empty">No %%gpumem reports in this notebook yet.</div>
      ) : (
        <ul className="jp-GpuMem-reportList">
          {props.reports.map((entry, i) => {
            const r = entry.report;
            const peak = peakOf(entry);
            const largest = largestModuleOf(entry);
            return (
              <li key={`${entry.cellId}:${i}`} className="jp-GpuMem-reportCard">
                <button
                  className="jp-GpuMem-reportItem"
                  onClick={() => props.onReveal(entry)}
                  title="Show this cell"
                >
                  <span className="jp-GpuMem-reportItemName">
                    {r.execution_count !== null && r.execution_count !== undefined
                      ? `[${r.execution_count}] `
                      : ''}
                    {r.name ?? '%%gpumem'}
                  </span>
                  <span className={`jp-GpuMem-status jp-mod-${r.status === 'ok' ? 'ok' : 'bad'}`}>
                    {r.status}
                  </span>
                  <span className="jp-GpuMem-reportItemStats">
                    peak {formatBytes(peak.bytes, props.units)}
                    {peak.cpu ? ' (CPU)' : ''} · {formatSeconds(r.wall_s)}
                  </span>
                </button>
                {largest && (
                  <button
                    className="jp-GpuMem-reportModule"
                    onClick={() =>
                      props.onReveal(entry, { device: largest.device, path: largest.path })
                    }
                    title={`Show ${moduleName(largest.path)} in this report's modules`}
                  >
                    <span className="jp-GpuMem-reportModuleLabel">largest:</span>
                    <span className="jp-GpuMem-reportModulePath">{moduleName(largest.path)}</span>
                    <span className="jp-GpuMem-reportModuleBytes">
                      {formatBytes(largest.bytes, props.units)}
                    </span>
                  </button>
                )}
              </li>
            );
          })}
        </ul>
      )}
    </section>
  );
}

/** The whole sidebar as a pure function of its props. */
export function SidebarView(props: ISidebarProps): JSX.Element {
  const { sample, units } = props;
  let body: JSX.Element;
  if (sample === null || (!sample.available && sample.reason === STARTING_REASON)) {
    body = (
      <div className="jp-GpuMem-empty">
        {props.error ? 'No GPU data yet.' : 'Reading the GPUs…'}
      </div>
    );
  } else if (!sample.available) {
    body = <NoGpu reason={sample.reason} />;
  } else if (!sample.devices.length) {
    body = <div className="jp-GpuMem-empty">NVML sees no GPU.</div>;
  } else {
    body = (
      <>
        {sample.devices.map(device => (
          <DeviceCard
            key={device.index}
            device={device}
            points={props.series(device.index)}
            window_s={props.window_s}
            kernelPids={props.kernelPids}
            units={units}
          />
        ))}
      </>
    );
  }
  const k = props.kernelProcesses;
  return (
    <div className="jp-GpuMem-sidebarBody">
      <div className="jp-GpuMem-title">
        <span>GPU memory</span>
        {sample?.driver_version && (
          <span className="jp-GpuMem-driver">driver {sample.driver_version}</span>
        )}
      </div>
      {props.error && (
        <div className="jp-GpuMem-error" role="alert">
          Cannot reach the GPU monitor: {props.error}. Retrying…
        </div>
      )}
      {body}
      {k && k.pids.length > 0 && (
        <div className="jp-GpuMem-kernelInfo">
          Kernel process{k.pids.length > 1 ? 'es' : ''}: {k.pids.join(', ')}
          {k.matched_by === 'kernel-reported' ? ' (as reported by the kernel)' : ''}
        </div>
      )}
      <KernelHostSection
        host={props.kernelHost}
        kernelId={props.kernelId}
        notebookTitle={props.notebookTitle}
        units={units}
      />
      <ReportList
        notebookTitle={props.notebookTitle}
        reports={props.reports}
        onReveal={props.onReveal}
        units={units}
      />
    </div>
  );
}

export namespace GpuSidebar {
  export interface IOptions {
    model: GpuModel;
    reports: NotebookReports;
    units: () => Units;
    /** Called after a report's cell was selected, to bring its notebook forward. */
    onReveal?: (entry: IReportEntry) => void;
  }
}

/** The sidebar widget: re-renders on model and report changes while visible. */
export class GpuSidebar extends ReactWidget {
  constructor(options: GpuSidebar.IOptions) {
    super();
    this._options = options;
    this.addClass('jp-GpuMem-sidebar');
    options.model.changed.connect(this._onChange, this);
    options.reports.changed.connect(this._onChange, this);
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._options.model.changed.disconnect(this._onChange, this);
    this._options.reports.changed.disconnect(this._onChange, this);
    super.dispose();
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this.update();
  }

  protected render(): JSX.Element {
    const { model, reports } = this._options;
    return (
      <SidebarView
        sample={model.sample}
        error={model.error}
        series={index => model.series(index)}
        window_s={model.window_s}
        kernelPids={model.kernelPids}
        kernelProcesses={model.kernelProcesses}
        kernelId={model.kernelId}
        kernelHost={model.kernelHost}
        notebookTitle={reports.notebook?.title.label ?? null}
        reports={reports.entries}
        onReveal={(entry, module) => {
          if (reports.reveal(entry, module)) {
            this._options.onReveal?.(entry);
          }
        }}
        units={this._options.units()}
      />
    );
  }

  private _onChange(): void {
    if (this.isVisible) {
      this.update();
    }
  }

  private _options: GpuSidebar.IOptions;
}
