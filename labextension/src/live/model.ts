/**
 * The live GPU state shared by the sidebar and the status bar item: one lumino
 * `Poll` per page, however many views read it. The poll pauses while the browser
 * tab is hidden and backs off exponentially while the server fails.
 */
import { IDisposable } from '@lumino/disposable';
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import {
  IDevice,
  IGpuApi,
  IKernelHost,
  IKernelProcesses,
  IMemoryPoint,
  ISample,
  memoryPoint
} from '../wire';

/** One point of a device's sparkline. */
export interface IPoint {
  /** Unix time in seconds (server clock). */
  time: number;
  used_bytes: number | null;
}

export namespace GpuModel {
  export interface IOptions {
    /** Where samples come from (the server, or a fake in tests). */
    api: IGpuApi;
    /** Seconds between polls. */
    interval_s?: number;
    /** Seconds of history kept for the sparklines. */
    window_s?: number;
    /** When polling pauses; the default stops it while the tab is hidden. */
    standby?: Poll.Standby | (() => boolean | Poll.Standby);
  }
}

/** Lowest poll interval the model accepts (the server samples no faster). */
export const MIN_INTERVAL_S = 0.25;
/** Longest wait between polls while backing off. */
export const MAX_BACKOFF_S = 30;
/**
 * Most pages of history asked for on the first sample: the server answers up to
 * 1000 points a page, and the longest window (60 minutes) at the shortest poll
 * interval is 14400 points.
 */
export const MAX_BACKFILL_PAGES = 20;

export class GpuModel implements IDisposable {
  constructor(options: GpuModel.IOptions) {
    this._api = options.api;
    this._window_s = options.window_s ?? 300;
    const interval_s = clampInterval(options.interval_s ?? 1);
    this._poll = new Poll({
      auto: false,
      factory: () => this._tick(),
      frequency: {
        interval: interval_s * 1000,
        backoff: true,
        max: MAX_BACKOFF_S * 1000
      },
      name: 'jupyter-gpumem:sample',
      standby: options.standby ?? 'when-hidden'
    });
  }

  /** Emitted after every poll, whether it succeeded or not, and on kernel changes. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** The poll, for the tests and for callers that want `refresh()`. */
  get poll(): Poll {
    return this._poll;
  }

  /** The latest sample, or null before the first answer. */
  get sample(): ISample | null {
    return this._sample;
  }

  /** Why the last poll failed, or null when it succeeded. */
  get error(): string | null {
    return this._error;
  }

  /** Seconds between polls (clamped to at least MIN_INTERVAL_S). */
  get interval_s(): number {
    return this._poll.frequency.interval / 1000;
  }
  set interval_s(value: number) {
    const interval = clampInterval(value) * 1000;
    if (interval !== this._poll.frequency.interval) {
      this._poll.frequency = { ...this._poll.frequency, interval };
    }
  }

  /** Seconds of history kept for the sparklines. */
  get window_s(): number {
    return this._window_s;
  }

  /** The kernel whose processes are highlighted (the active notebook's), or null. */
  get kernelId(): string | null {
    return this._kernelId;
  }
  set kernelId(value: string | null) {
    if (value === this._kernelId) {
      return;
    }
    this._kernelId = value;
    this._kernelProcesses = null;
    this._kernelHost = null;
    this._changed.emit();
    if (value && this._poll.state.phase !== 'constructed' && !this._poll.isDisposed) {
      void this._poll.refresh();
    }
  }

  /** The active kernel's GPU processes, when the server could tell. */
  get kernelProcesses(): IKernelProcesses | null {
    return this._kernelProcesses;
  }

  /** The host memory (RSS) of the active kernel's process tree, GPU or not. */
  get kernelHost(): IKernelHost | null {
    return this._kernelHost;
  }

  /** PIDs to highlight in the process tables. */
  get kernelPids(): ReadonlySet<number> {
    const k = this._kernelProcesses;
    if (!k) {
      return new Set();
    }
    return new Set([...k.pids, ...k.processes.map(p => p.pid)]);
  }

  /** What the sparklines draw of the last `window_s` seconds, oldest first. */
  get history(): ReadonlyArray<IMemoryPoint> {
    return this._history;
  }

  /** One device's sparkline points, oldest first. */
  series(deviceIndex: number): IPoint[] {
    const points: IPoint[] = [];
    for (const point of this._history) {
      const device = point.devices.find(d => d.index === deviceIndex);
      if (device) {
        points.push({ time: point.time, used_bytes: device.memory_used_bytes });
      }
    }
    return points;
  }

  /** The device with the highest share of its memory in use, for the status bar. */
  get busiest(): IDevice | null {
    return busiestDevice(this._sample);
  }

  /** Start polling (the first poll runs at once). */
  start(): Promise<void> {
    return this._poll.start();
  }

  get isDisposed(): boolean {
    return this._poll.isDisposed;
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._poll.dispose();
    Signal.clearData(this);
  }

  /**
   * One poll. It must throw on failure: a resolved promise tells the Poll all is
   * well and it would never back off.
   */
  private async _tick(): Promise<void> {
    let sample: ISample;
    try {
      sample = await this._api.sample();
    } catch (error) {
      this._error = errorMessage(error);
      this._changed.emit();
      throw error;
    }
    this._error = null;
    this._sample = sample;
    await this._record(sample);
    await this._updateKernel();
    this._changed.emit();
  }

  /** Append to the history; on the first sample, backfill from the server's buffer. */
  private async _record(sample: ISample): Promise<void> {
    if (this._history.length === 0 && sample.available) {
      this._history = (await this._backfill(sample.time)).filter(p => p.time < sample.time);
    }
    const last = this._history[this._history.length - 1];
    if (!last || sample.time > last.time) {
      this._history.push(memoryPoint(sample));
    }
    const oldest = sample.time - this._window_s;
    while (this._history.length && this._history[0].time < oldest) {
      this._history.shift();
    }
  }

  /**
   * The server's points of the window before `time`, one per poll interval (what
   * the sparklines draw, page after page). After a failure, what came before it: an
   * older server answers no points, and the sparkline starts from now.
   */
  private async _backfill(time: number): Promise<IMemoryPoint[]> {
    const points: IMemoryPoint[] = [];
    let since = time - this._window_s;
    try {
      for (let page = 0; page < MAX_BACKFILL_PAGES; page++) {
        const answer = await this._api.memoryHistory(since, this.interval_s);
        points.push(...answer.points);
        if (answer.next_since === null || !(answer.next_since > since)) {
          break;
        }
        since = answer.next_since;
      }
    } catch {
      // Keep the pages that came.
    }
    return points;
  }

  /**
   * The active kernel's GPU processes (when there are GPUs) and host memory;
   * never fails the poll. An unknown kernel or an older server without an
   * endpoint leaves that part null.
   */
  private async _updateKernel(): Promise<void> {
    const kernelId = this._kernelId;
    if (!kernelId) {
      this._kernelProcesses = null;
      this._kernelHost = null;
      return;
    }
    const [processes, host] = await Promise.all([
      this._sample?.available
        ? this._api.kernelProcesses(kernelId).catch(() => null)
        : Promise.resolve(null),
      this._api.kernelHost(kernelId).catch(() => null)
    ]);
    if (kernelId === this._kernelId) {
      this._kernelProcesses = processes;
      this._kernelHost = host;
    }
  }

  private _api: IGpuApi;
  private _changed = new Signal<this, void>(this);
  private _error: string | null = null;
  private _history: IMemoryPoint[] = [];
  private _kernelId: string | null = null;
  private _kernelHost: IKernelHost | null = null;
  private _kernelProcesses: IKernelProcesses | null = null;
  private _poll: Poll;
  private _sample: ISample | null = null;
  private _window_s: number;
}

/** The device of a sample with the highest used/total ratio (ties: most bytes used). */
export function busiestDevice(sample: ISample | null): IDevice | null {
  if (!sample?.available) {
    return null;
  }
  let best: IDevice | null = null;
  let bestKey: [number, number] = [-1, -1];
  for (const device of sample.devices) {
    const used = device.memory_used_bytes;
    const total = device.memory_total_bytes;
    const ratio = used !== null && total ? used / total : -0.5;
    const key: [number, number] = [ratio, used ?? -1];
    if (key[0] > bestKey[0] || (key[0] === bestKey[0] && key[1] > bestKey[1])) {
      best = device;
      bestKey = key;
    }
  }
  return best;
}

function clampInterval(interval_s: number): number {
  if (!Number.isFinite(interval_s)) {
    return 1;
  }
  return Math.min(Math.max(interval_s, MIN_INTERVAL_S), MAX_BACKOFF_S);
}

function errorMessage(error: unknown): string {
  if (error instanceof Error) {
    return error.message || error.name;
  }
  return String(error);
}
