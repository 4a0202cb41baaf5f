import { ServerConnection } from '@jupyterlab/services';

import { fixture } from '../../__tests__/helpers';
import {
  ApiError,
  fetchHistory,
  fetchKernelHost,
  fetchKernelProcesses,
  fetchMemoryHistory,
  fetchSample
} from '../request';

/** Server settings whose fetch answers from a script and records the URLs asked. */
function settingsAnswering(status: number, body: string) {
  const urls: string[] = [];
  const fetch = jest.fn(async (input: RequestInfo) => {
    // Without ServerConnection's cache buster (`?1700000000000` or `&1700000000000`).
    urls.push((typeof input === 'string' ? input : input.url).replace(/[?&]\d+$/, ''));
    return new Response(body, { status, statusText: status === 200 ? 'OK' : 'Error' });
  });
  const settings = ServerConnection.makeSettings({
    baseUrl: 'http://localhost:8888/base/',
    fetch: fetch as any
  });
  return { settings, urls };
}

describe('request', () => {
  it('fetches and parses a sample under the base URL', async () => {
    const { settings, urls } = settingsAnswering(200, JSON.stringify(fixture('sample.json')));
    const sample = await fetchSample(settings);
    expect(sample.devices).toHaveLength(2);
    expect(urls).toEqual(['http://localhost:8888/base/jupyter-gpumem/api/sample']);
  });

  it('puts `since` in the query of the history request', async () => {
    const { settings, urls } = settingsAnswering(200, JSON.stringify({ interval_s: 1, samples: [] }));
    await fetchHistory(1767225600.5, settings);
    expect(urls[0]).toBe('http://localhost:8888/base/jupyter-gpumem/api/history?since=1767225600.5');
  });

  it('asks for the memory view of the history, one point per step', async () => {
    const body = {
      interval_s: 0.25,
      points: [{ time: 1767225601, devices: [{ index: 0, memory_used_bytes: 1024 }] }],
      next_since: 1767225601
    };
    const { settings, urls } = settingsAnswering(200, JSON.stringify(body));
    expect(await fetchMemoryHistory(1767225600.5, 1, settings)).toEqual(body);
    expect(urls).toEqual([
      'http://localhost:8888/base/jupyter-gpumem/api/history?view=memory&since=1767225600.5&step=1'
    ]);
  });

  it('escapes the kernel id in the path', async () => {
    const { settings, urls } = settingsAnswering(
      200,
      JSON.stringify({ kernel_id: 'a b', pids: [], matched_by: null, processes: [] })
    );
    await fetchKernelProcesses('a b', settings);
    expect(urls[0]).toContain('/jupyter-gpumem/api/kernels/a%20b/processes');
  });

  it("fetches a kernel's host memory", async () => {
    const body = {
      kernel_id: 'a b',
      pid: 12,
      pids: [12],
      rss_bytes: 1024,
      host_total_bytes: 4096,
      host_available_bytes: 2048,
      reason: null
    };
    const { settings, urls } = settingsAnswering(200, JSON.stringify(body));
    expect(await fetchKernelHost('a b', settings)).toEqual(body);
    expect(urls).toEqual(['http://localhost:8888/base/jupyter-gpumem/api/kernels/a%20b/host']);
  });

  it('throws on HTTP errors, with the status and the server message', async () => {
    const { settings } = settingsAnswering(403, JSON.stringify({ message: 'Forbidden' }));
    const error = await fetchSample(settings).catch(e => e);
    expect(error).toBeInstanceOf(ApiError);
    expect(error.status).toBe(403);
    expect(error.message).toContain('Forbidden');
  });

  it('throws on a malformed body', async () => {
    const { settings } = settingsAnswering(200, '{"devices": 3}');
    await expect(fetchSample(settings)).rejects.toThrow('expected a number at .time');
  });
});
