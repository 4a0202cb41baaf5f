/**
 * The single place that talks to the server: `{base_url}/jupyter-gpumem/api/...`.
 * Every function throws on a network error, an HTTP error or a malformed body,
 * so that callers (the polling model) can back off.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import {
  IHealth,
  IHistory,
  IKernelHost,
  IKernelProcesses,
  IMemoryHistory,
  ISample,
  parseHealth,
  parseHistory,
  parseKernelHost,
  parseKernelProcesses,
  parseMemoryHistory,
  parseSample
} from './live';

/** The URL namespace of the server extension. */
export const API_NAMESPACE = 'jupyter-gpumem/api';

/** An HTTP answer other than 2xx, with the status so that callers can tell 404 apart. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string
  ) {
    super(message);
    this.name = 'ApiError';
  }
}

/** GET one endpoint and return its parsed JSON body. */
export async function requestAPI(
  endPoint: string,
  settings: ServerConnection.ISettings = ServerConnection.makeSettings(),
  query: Record<string, string> = {}
): Promise<unknown> {
  // The query goes after the join: URLExt.join would treat `?` as part of the path.
  const url =
    URLExt.join(settings.baseUrl, API_NAMESPACE, endPoint) +
    URLExt.objectToQueryString(query);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, { method: 'GET' }, settings);
  } catch (error) {
    throw new ServerConnection.NetworkError(error as TypeError);
  }
  const text = await response.text();
  if (!response.ok) {
    let message = `${response.status} ${response.statusText}`.trim();
    try {
      const body = JSON.parse(text) as { message?: unknown; reason?: unknown };
      const detail = body.message ?? body.reason;
      if (typeof detail === 'string' && detail) {
        message = `${message}: ${detail}`;
      }
    } catch {
      // Not JSON (an HTML error page): the status line says enough.
    }
    throw new ApiError(response.status, `GET ${endPoint} failed: ${message}`);
  }
  try {
    return JSON.parse(text);
  } catch {
    throw new ApiError(response.status, `GET ${endPoint}: the answer is not JSON`);
  }
}

/** Where the server stands, NVML included. */
export async function fetchHealth(
  settings?: ServerConnection.ISettings
): Promise<IHealth> {
  return parseHealth(await requestAPI('health', settings));
}

/** The latest sample of every device. */
export async function fetchSample(
  settings?: ServerConnection.ISettings
): Promise<ISample> {
  return parseSample(await requestAPI('sample', settings));
}

/**
 * The first page of the samples newer than `since` (unix seconds) still in the
 * server's ring buffer; `next_since` asks for the next.
 */
export async function fetchHistory(
  since: number,
  settings?: ServerConnection.ISettings
): Promise<IHistory> {
  return parseHistory(
    await requestAPI('history', settings, { since: String(since) })
  );
}

/**
 * The first page of what the sparklines draw (each device's memory used) newer than
 * `since`, one point per `step_s` seconds; `next_since` asks for the next.
 */
export async function fetchMemoryHistory(
  since: number,
  step_s: number,
  settings?: ServerConnection.ISettings
): Promise<IMemoryHistory> {
  return parseMemoryHistory(
    await requestAPI('history', settings, {
      view: 'memory',
      since: String(since),
      step: String(step_s)
    })
  );
}

/** The GPU processes of one kernel (for highlighting the active notebook's). */
export async function fetchKernelProcesses(
  kernelId: string,
  settings?: ServerConnection.ISettings
): Promise<IKernelProcesses> {
  const path = `kernels/${encodeURIComponent(kernelId)}/processes`;
  return parseKernelProcesses(await requestAPI(path, settings));
}

/** The host memory (RSS) of one kernel's process tree, GPU or not. */
export async function fetchKernelHost(
  kernelId: string,
  settings?: ServerConnection.ISettings
): Promise<IKernelHost> {
  const path = `kernels/${encodeURIComponent(kernelId)}/host`;
  return parseKernelHost(await requestAPI(path, settings));
}

/** What the model needs from the server; tests pass a fake. */
export interface IGpuApi {
  sample(): Promise<ISample>;
  memoryHistory(since: number, step_s: number): Promise<IMemoryHistory>;
  kernelProcesses(kernelId: string): Promise<IKernelProcesses>;
  kernelHost(kernelId: string): Promise<IKernelHost>;
}

/** The real API, bound to the page's server settings. */
export function serverApi(
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): IGpuApi {
  return {
    sample: () => fetchSample(settings),
    memoryHistory: (since, step_s) => fetchMemoryHistory(since, step_s, settings),
    kernelProcesses: kernelId => fetchKernelProcesses(kernelId, settings),
    kernelHost: kernelId => fetchKernelHost(kernelId, settings)
  };
}
