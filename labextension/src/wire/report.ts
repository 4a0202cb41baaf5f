/**
 * The `%%gpumem` report's wire format: the report's JSON, `Report.to_dict()` in the
 * kernel, as its mime bundle carries it. Fixtures, read by the Python tests and these
 * alike: `tests/fixtures/report.json`, and `tests/fixtures/report_gpu_training_step.json`
 * recorded on a GPU with the timeline, tensors and leak hints, both schema 1;
 * `tests/fixtures/report_gpu_generate.json`, a `generate` call, and
 * `tests/fixtures/report_cpu_gpt_step.json`, a GPT-2 training step, both schema 3.
 *
 * Bytes are integers, seconds floats, and an unknown value is `null` (never 0).
 * The parse functions check the shape once at the boundary so that the UI can
 * trust the types; they are lenient about optional fields the kernel may omit.
 */
import {
  array,
  num,
  numbers,
  object,
  optNum,
  optStr,
  strings,
  WireFormatError
} from './json';

/** Mime type of the `%%gpumem` report's JSON output. */
export const REPORT_MIME_TYPE = 'application/vnd.jupyter-gpumem.report+json';

/**
 * The report schemas this extension reads (the report's `schema` field). Schema 2 has
 * the same shape as 1 and more names: the kv_cache, library_workspace and cuda_graph_pool
 * categories and the prefill and decode phases. Schema 3 adds each device's
 * `module_tree` and `largest_module` (the peak by module). A newer schema is read all the
 * same (unknown names show plainly) and the report says so (`schemaWarning`).
 */
export const REPORT_SCHEMAS: ReadonlyArray<number> = [1, 2, 3];

/** What a device's memory was made of at the peak (bytes per category). */
export type IBreakdown = Record<string, number>;

/** A stretch of the cell spent in one phase of one training step (`PhaseBand`). */
export interface IPhaseBand {
  /** Seconds since the cell started. */
  start_s: number;
  end_s: number;
  /** forward, backward, optimizer, prefill, decode or other. */
  phase: string;
  /** 0-based iteration of the training loop. */
  step: number | null;
}

/** Allocated and reserved bytes over the cell (`Timeline`); one point per `t_s`. */
export interface ITimeline {
  t_s: number[];
  allocated_bytes: number[];
  reserved_bytes: number[];
  bands: IPhaseBand[];
  peak_t_s: number | null;
  peak_bytes: number | null;
}

/** A tensor the cell left alive, or one of the largest it freed (`TensorRecord`). */
export interface ITensorRecord {
  name: string | null;
  /** `null` when unknown; `[]` for a scalar. */
  shape: number[] | null;
  dtype: string | null;
  nbytes: number | null;
  device: string | null;
  /** `"cell line 3"` or `"file.py:42"`. */
  line: string | null;
  alive: boolean;
}

/** What was live when the allocator ran out of memory (`OomInfo`). */
export interface IOomInfo {
  requested_bytes: number | null;
  breakdown: IBreakdown | null;
  /** The breakdown category that dominated. */
  dominant: string | null;
  advice: string | null;
  largest: ITensorRecord[];
}

/** Memory held for a fixable reason (`LeakHint`). */
export interface ILeakHint {
  /** output-cache, traceback, autograd-graph, cycles or growth. */
  kind: string;
  /** Bytes held; for "growth", the typical growth per run. */
  bytes: number | null;
  /** The message in binary units, for front ends that do not format `template`. */
  message: string;
  /** The message with `{name}` for each byte amount of `amounts`; null in older reports. */
  template?: string | null;
  /** Bytes for each `{name}` of `template`. */
  amounts?: Record<string, number>;
  fix: string;
  /** The holders, e.g. `Out[3]` or variable names. */
  where: string[];
}

/**
 * One module at the peak (the kernel's `ModuleBytes`): bytes by category,
 * its children's included. The root's path is `""` (the model) and its bytes are the
 * device's breakdown; a module called more than once in one forward reads `block#0`,
 * `block#1`, and its children `block.fc#0`. Children come in the order the modules ran.
 */
export interface IModuleNode {
  path: string;
  /** Category (the breakdown's names) -> bytes, nonzero only. */
  bytes: IBreakdown;
  children: IModuleNode[];
}

/** The module (not the root) whose own bytes, its children's taken out, are the most. */
export interface ILargestModule {
  path: string;
  bytes: number;
}

/** One device of a `%%gpumem` report. */
export interface IReportDevice {
  device?: string;
  index: number;
  name?: string | null;
  total_bytes?: number | null;
  allocated_before_bytes?: number | null;
  allocated_after_bytes?: number | null;
  allocated_delta_bytes?: number | null;
  peak_allocated_bytes: number | null;
  peak_reserved_bytes: number | null;
  reserved_after_bytes?: number | null;
  cache_bytes: number | null;
  nvml_process_bytes?: number | null;
  non_torch_bytes?: number | null;
  breakdown: IBreakdown | null;
  peak_phase: string | null;
  peak_step: number | null;
  timeline: ITimeline | null;
  tensors: ITensorRecord[];
  oom: IOomInfo | null;
  /** The peak by module (schema 3); null where no module ran, absent in older reports. */
  module_tree?: IModuleNode | null;
  largest_module?: ILargestModule | null;
}

/** The `%%gpumem` report (`application/vnd.jupyter-gpumem.report+json`). */
export interface IReport {
  /** The wire format's version (`REPORT_SCHEMAS`); absent in the earliest reports. */
  schema?: number;
  id?: string;
  name: string | null;
  execution_count?: number | null;
  /** Unix time in seconds. */
  started_at?: number | null;
  wall_s: number | null;
  status: string;
  error?: string | null;
  cuda_available: boolean;
  source?: string | null;
  budget_bytes?: number | null;
  notes: string[];
  warnings: string[];
  devices: IReportDevice[];
  leak_hints: ILeakHint[];
  /** The same cell re-run has the same key. */
  cell_key?: string | null;
  /** The device the cell used most, as the kernel decided it; absent in older reports. */
  main_device?: string | null;
  /** Whether the main device's peak exceeded `budget_bytes`; absent in older reports. */
  over_budget?: boolean;
  /** A worker process's report: its rank (start_processes' index) and pid. */
  rank?: number | null;
  pid?: number | null;
  /** The reports of the worker processes the cell started, by rank (report/ranks.tsx). */
  ranks?: IReport[];
  /** The rank with the highest peak allocated, as the kernel decided it. */
  worst_rank?: number | null;
}

function parseBreakdown(value: unknown, path: string): IBreakdown | null {
  if (value === null || value === undefined) {
    return null;
  }
  const o = object(value, path);
  const out: IBreakdown = {};
  for (const [key, bytes] of Object.entries(o)) {
    const n = optNum(bytes, `${path}.${key}`);
    if (n !== null) {
      out[key] = n;
    }
  }
  return out;
}

function parseBand(value: unknown, path: string): IPhaseBand {
  const o = object(value, path);
  return {
    start_s: num(o.start_s, `${path}.start_s`),
    end_s: num(o.end_s, `${path}.end_s`),
    phase: optStr(o.phase, `${path}.phase`) ?? 'other',
    step: optNum(o.step, `${path}.step`)
  };
}

function parseTimeline(value: unknown, path: string): ITimeline | null {
  if (value === null || value === undefined) {
    return null;
  }
  const o = object(value, path);
  return {
    t_s: numbers(o.t_s, `${path}.t_s`),
    allocated_bytes: numbers(o.allocated_bytes, `${path}.allocated_bytes`),
    reserved_bytes: numbers(o.reserved_bytes, `${path}.reserved_bytes`),
    bands: array(o.bands ?? [], `${path}.bands`).map((b, i) =>
      parseBand(b, `${path}.bands[${i}]`)
    ),
    peak_t_s: optNum(o.peak_t_s, `${path}.peak_t_s`),
    peak_bytes: optNum(o.peak_bytes, `${path}.peak_bytes`)
  };
}

function parseTensor(value: unknown, path: string): ITensorRecord {
  const o = object(value, path);
  return {
    name: optStr(o.name, `${path}.name`),
    shape:
      o.shape === null || o.shape === undefined ? null : numbers(o.shape, `${path}.shape`),
    dtype: optStr(o.dtype, `${path}.dtype`),
    nbytes: optNum(o.nbytes, `${path}.nbytes`),
    device: optStr(o.device, `${path}.device`),
    line: optStr(o.line, `${path}.line`),
    alive: o.alive === true
  };
}

function tensors(value: unknown, path: string): ITensorRecord[] {
  return array(value ?? [], path).map((t, i) => parseTensor(t, `${path}[${i}]`));
}

function parseOom(value: unknown, path: string): IOomInfo | null {
  if (value === null || value === undefined) {
    return null;
  }
  const o = object(value, path);
  return {
    requested_bytes: optNum(o.requested_bytes, `${path}.requested_bytes`),
    breakdown: parseBreakdown(o.breakdown, `${path}.breakdown`),
    dominant: optStr(o.dominant, `${path}.dominant`),
    advice: optStr(o.advice, `${path}.advice`),
    largest: tensors(o.largest, `${path}.largest`)
  };
}

function parseLeakHint(value: unknown, path: string): ILeakHint {
  const o = object(value, path);
  return {
    kind: optStr(o.kind, `${path}.kind`) ?? 'leak',
    bytes: optNum(o.bytes, `${path}.bytes`),
    message: optStr(o.message, `${path}.message`) ?? '',
    template: optStr(o.template, `${path}.template`),
    amounts: parseBreakdown(o.amounts, `${path}.amounts`) ?? {},
    fix: optStr(o.fix, `${path}.fix`) ?? '',
    where: strings(o.where, `${path}.where`)
  };
}

function parseModuleNode(value: unknown, path: string): IModuleNode {
  const o = object(value, path);
  return {
    path: optStr(o.path, `${path}.path`) ?? '',
    bytes: parseBreakdown(o.bytes, `${path}.bytes`) ?? {},
    children: array(o.children ?? [], `${path}.children`).map((c, i) =>
      parseModuleNode(c, `${path}.children[${i}]`)
    )
  };
}

function parseModuleTree(value: unknown, path: string): IModuleNode | null {
  return value === null || value === undefined ? null : parseModuleNode(value, path);
}

function parseLargestModule(value: unknown, path: string): ILargestModule | null {
  if (value === null || value === undefined) {
    return null;
  }
  const o = object(value, path);
  return {
    path: optStr(o.path, `${path}.path`) ?? '',
    bytes: num(o.bytes, `${path}.bytes`)
  };
}

function parseReportDevice(value: unknown, path: string): IReportDevice {
  const o = object(value, path);
  const opt = (key: string) => optNum(o[key], `${path}.${key}`);
  return {
    device: optStr(o.device, `${path}.device`) ?? undefined,
    index: optNum(o.index, `${path}.index`) ?? 0,
    name: optStr(o.name, `${path}.name`),
    total_bytes: opt('total_bytes'),
    allocated_before_bytes: opt('allocated_before_bytes'),
    allocated_after_bytes: opt('allocated_after_bytes'),
    allocated_delta_bytes: opt('allocated_delta_bytes'),
    peak_allocated_bytes: opt('peak_allocated_bytes'),
    peak_reserved_bytes: opt('peak_reserved_bytes'),
    reserved_after_bytes: opt('reserved_after_bytes'),
    cache_bytes: opt('cache_bytes'),
    nvml_process_bytes: opt('nvml_process_bytes'),
    non_torch_bytes: opt('non_torch_bytes'),
    breakdown: parseBreakdown(o.breakdown, `${path}.breakdown`),
    peak_phase: optStr(o.peak_phase, `${path}.peak_phase`),
    peak_step: opt('peak_step'),
    timeline: parseTimeline(o.timeline, `${path}.timeline`),
    tensors: tensors(o.tensors, `${path}.tensors`),
    oom: parseOom(o.oom, `${path}.oom`),
    module_tree: parseModuleTree(o.module_tree, `${path}.module_tree`),
    largest_module: parseLargestModule(o.largest_module, `${path}.largest_module`)
  };
}

function parseSchema(value: unknown): number | undefined {
  const n = optNum(value, '.schema');
  if (n === null) {
    return undefined;
  }
  if (!Number.isInteger(n) || n < 1) {
    throw new WireFormatError(
      `expected a schema number (${REPORT_SCHEMAS.join(', ')}, ...)`,
      '.schema'
    );
  }
  return n;
}

/** Parse a report mime bundle's JSON; throws WireFormatError on a wrong shape. */
export function parseReport(value: unknown): IReport {
  const o = object(value, '');
  return {
    schema: parseSchema(o.schema),
    id: optStr(o.id, '.id') ?? undefined,
    name: optStr(o.name, '.name'),
    execution_count: optNum(o.execution_count, '.execution_count'),
    started_at: optNum(o.started_at, '.started_at'),
    wall_s: optNum(o.wall_s, '.wall_s'),
    status: optStr(o.status, '.status') ?? 'unknown',
    error: optStr(o.error, '.error'),
    cuda_available: o.cuda_available !== false,
    source: optStr(o.source, '.source'),
    budget_bytes: optNum(o.budget_bytes, '.budget_bytes'),
    notes: strings(o.notes, '.notes'),
    warnings: strings(o.warnings, '.warnings'),
    devices: array(o.devices ?? [], '.devices').map((d, i) =>
      parseReportDevice(d, `.devices[${i}]`)
    ),
    leak_hints: array(o.leak_hints ?? [], '.leak_hints').map((h, i) =>
      parseLeakHint(h, `.leak_hints[${i}]`)
    ),
    cell_key: optStr(o.cell_key, '.cell_key'),
    main_device: optStr(o.main_device, '.main_device'),
    over_budget: o.over_budget === true,
    rank: optNum(o.rank, '.rank'),
    pid: optNum(o.pid, '.pid'),
    ranks: array(o.ranks ?? [], '.ranks').map(r => parseReport(r)),
    worst_rank: optNum(o.worst_rank, '.worst_rank')
  };
}
