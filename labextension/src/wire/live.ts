/**
 * The live view's wire format: the server's sample JSON and the other answers of
 * `GET /jupyter-gpumem/api/...`, served by the jupyter_gpumem server extension
 * (`tests/fixtures/sample.json` is one sample, read by the Python tests and these alike).
 *
 * Bytes are integers, seconds floats, and an unknown value is `null` (never 0), with
 * NVML's reason in `reasons`. The parse functions check the shape once at the boundary
 * so that the UI can trust the types; they are lenient about optional fields the server
 * may omit.
 */
import { array, num, object, optNum, optStr } from './json';

/** `GET /jupyter-gpumem/api/health` */
export interface IHealth {
  status: string;
  version: string;
  nvml: { available: boolean; reason: string | null };
}

/** One process on one device, as NVML sees it. */
export interface IProcess {
  pid: number;
  command: string | null;
  memory_bytes: number | null;
}

/** One device (MIG instances included), numbered as torch in a kernel would. */
export interface IDevice {
  index: number;
  uuid: string | null;
  name: string | null;
  memory_total_bytes: number | null;
  memory_used_bytes: number | null;
  utilization_percent: number | null;
  temperature_c: number | null;
  power_w: number | null;
  is_mig: boolean;
  parent_index: number | null;
  /** Field name -> why that field is `null`. */
  reasons: Record<string, string>;
  processes: IProcess[];
}

/** `GET /jupyter-gpumem/api/sample`: one sampling pass. */
export interface ISample {
  /** Unix time in seconds. */
  time: number;
  interval_s: number;
  available: boolean;
  /** Why there are no devices, when `available` is false. */
  reason: string | null;
  driver_version: string | null;
  devices: IDevice[];
}

/**
 * `GET /jupyter-gpumem/api/history?since=<unix s>&limit=<n>&step=<s>&view=full|memory`:
 * one page of the samples the server keeps, oldest first. A page holds at most `limit`
 * samples (1 to 1000, 1000 if left out) and about 512 KiB of them, one at least;
 * `next_since` is the `since` of the next page, null on the last. `step` keeps the
 * first sample of each `step`-second span of time. `view=memory` answers `IMemoryHistory`.
 */
export interface IHistory {
  interval_s: number;
  samples: ISample[];
  next_since: number | null;
}

/** A sample as the sparklines draw it: its time and each device's memory used. */
export interface IMemoryPoint {
  /** Unix time in seconds. */
  time: number;
  devices: Array<{ index: number; memory_used_bytes: number | null }>;
}

/** `GET /jupyter-gpumem/api/history?view=memory&...`: a page of `IMemoryPoint`s. */
export interface IMemoryHistory {
  interval_s: number;
  points: IMemoryPoint[];
  next_since: number | null;
}

/** `GET /jupyter-gpumem/api/kernels/<kernel_id>/processes` */
export interface IKernelProcesses {
  kernel_id: string;
  pids: number[];
  matched_by: 'pid' | 'kernel-reported' | null;
  processes: Array<IProcess & { device_index: number }>;
}

/**
 * `GET /jupyter-gpumem/api/kernels/<kernel_id>/host`: the resident memory of the
 * kernel's process tree, as the server extension reads it, and the machine's memory.
 * `rss_bytes` is null with a `reason` when the server cannot read it.
 */
export interface IKernelHost {
  kernel_id: string;
  /** The kernel's own process, when it runs on the server's machine. */
  pid: number | null;
  /** The processes whose RSS was summed: the kernel and its descendants. */
  pids: number[];
  rss_bytes: number | null;
  host_total_bytes: number | null;
  host_available_bytes: number | null;
  reason: string | null;
}

function parseProcess(value: unknown, path: string): IProcess {
  const o = object(value, path);
  return {
    pid: num(o.pid, `${path}.pid`),
    command: optStr(o.command, `${path}.command`),
    memory_bytes: optNum(o.memory_bytes, `${path}.memory_bytes`)
  };
}

function parseReasons(value: unknown, path: string): Record<string, string> {
  if (value === null || value === undefined) {
    return {};
  }
  const o = object(value, path);
  const out: Record<string, string> = {};
  for (const [key, reason] of Object.entries(o)) {
    out[key] = String(reason);
  }
  return out;
}

export function parseDevice(value: unknown, path = ''): IDevice {
  const o = object(value, path);
  return {
    index: num(o.index, `${path}.index`),
    uuid: optStr(o.uuid, `${path}.uuid`),
    name: optStr(o.name, `${path}.name`),
    memory_total_bytes: optNum(o.memory_total_bytes, `${path}.memory_total_bytes`),
    memory_used_bytes: optNum(o.memory_used_bytes, `${path}.memory_used_bytes`),
    utilization_percent: optNum(o.utilization_percent, `${path}.utilization_percent`),
    temperature_c: optNum(o.temperature_c, `${path}.temperature_c`),
    power_w: optNum(o.power_w, `${path}.power_w`),
    is_mig: o.is_mig === true,
    parent_index: optNum(o.parent_index, `${path}.parent_index`),
    reasons: parseReasons(o.reasons, `${path}.reasons`),
    processes: array(o.processes ?? [], `${path}.processes`).map((p, i) =>
      parseProcess(p, `${path}.processes[${i}]`)
    )
  };
}

export function parseSample(value: unknown, path = ''): ISample {
  const o = object(value, path);
  return {
    time: num(o.time, `${path}.time`),
    interval_s: num(o.interval_s, `${path}.interval_s`),
    available: o.available === true,
    reason: optStr(o.reason, `${path}.reason`),
    driver_version: optStr(o.driver_version, `${path}.driver_version`),
    devices: array(o.devices ?? [], `${path}.devices`).map((d, i) =>
      parseDevice(d, `${path}.devices[${i}]`)
    )
  };
}

export function parseHistory(value: unknown): IHistory {
  const o = object(value, '');
  return {
    interval_s: num(o.interval_s, '.interval_s'),
    samples: array(o.samples, '.samples').map((s, i) =>
      parseSample(s, `.samples[${i}]`)
    ),
    next_since: optNum(o.next_since, '.next_since')
  };
}

function parseMemoryPoint(value: unknown, path: string): IMemoryPoint {
  const o = object(value, path);
  return {
    time: num(o.time, `${path}.time`),
    devices: array(o.devices ?? [], `${path}.devices`).map((d, i) => {
      const device = object(d, `${path}.devices[${i}]`);
      return {
        index: num(device.index, `${path}.devices[${i}].index`),
        memory_used_bytes: optNum(
          device.memory_used_bytes,
          `${path}.devices[${i}].memory_used_bytes`
        )
      };
    })
  };
}

/** The point of the sparklines a polled sample adds. */
export function memoryPoint(sample: ISample): IMemoryPoint {
  return {
    time: sample.time,
    devices: sample.devices.map(d => ({
      index: d.index,
      memory_used_bytes: d.memory_used_bytes
    }))
  };
}

export function parseMemoryHistory(value: unknown): IMemoryHistory {
  const o = object(value, '');
  return {
    interval_s: num(o.interval_s, '.interval_s'),
    points: array(o.points, '.points').map((p, i) => parseMemoryPoint(p, `.points[${i}]`)),
    next_since: optNum(o.next_since, '.next_since')
  };
}

export function parseHealth(value: unknown): IHealth {
  const o = object(value, '');
  const nvml = object(o.nvml, '.nvml');
  return {
    status: String(optStr(o.status, '.status')),
    version: String(optStr(o.version, '.version')),
    nvml: {
      available: nvml.available === true,
      reason: optStr(nvml.reason, '.nvml.reason')
    }
  };
}

export function parseKernelProcesses(value: unknown): IKernelProcesses {
  const o = object(value, '');
  const matched = optStr(o.matched_by, '.matched_by');
  return {
    kernel_id: String(optStr(o.kernel_id, '.kernel_id')),
    pids: array(o.pids ?? [], '.pids').map((p, i) => num(p, `.pids[${i}]`)),
    matched_by: matched === 'pid' || matched === 'kernel-reported' ? matched : null,
    processes: array(o.processes ?? [], '.processes').map((p, i) => ({
      ...parseProcess(p, `.processes[${i}]`),
      device_index: num(object(p, '').device_index, `.processes[${i}].device_index`)
    }))
  };
}

export function parseKernelHost(value: unknown): IKernelHost {
  const o = object(value, '');
  return {
    kernel_id: String(optStr(o.kernel_id, '.kernel_id')),
    pid: optNum(o.pid, '.pid'),
    pids: array(o.pids ?? [], '.pids').map((p, i) => num(p, `.pids[${i}]`)),
    rss_bytes: optNum(o.rss_bytes, '.rss_bytes'),
    host_total_bytes: optNum(o.host_total_bytes, '.host_total_bytes'),
    host_available_bytes: optNum(o.host_available_bytes, '.host_available_bytes'),
    reason: optStr(o.reason, '.reason')
  };
}
