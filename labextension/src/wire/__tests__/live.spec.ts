import { fixture } from '../../__tests__/helpers';
import { WireFormatError } from '../json';
import {
  memoryPoint,
  parseHistory,
  parseKernelHost,
  parseKernelProcesses,
  parseMemoryHistory,
  parseSample
} from '../live';

describe('parseSample', () => {
  it('reads the shared sample fixture', () => {
    const sample = parseSample(fixture('sample.json'));
    expect(sample.available).toBe(true);
    expect(sample.driver_version).toBe('550.54.15');
    expect(sample.devices).toHaveLength(2);
    const [gpu, mig] = sample.devices;
    expect(gpu.name).toBe('NVIDIA H100 80GB HBM3');
    expect(gpu.memory_total_bytes).toBe(85520809984);
    expect(gpu.processes.map(p => p.pid)).toEqual([48211, 50377]);
    expect(mig.is_mig).toBe(true);
    expect(mig.parent_index).toBe(1);
    expect(mig.utilization_percent).toBeNull();
    expect(mig.reasons.utilization_percent).toBe('not supported');
    expect(mig.processes[0].memory_bytes).toBeNull();
  });

  it('keeps the typed reason of an unavailable sample', () => {
    const sample = parseSample({
      time: 1,
      interval_s: 1,
      available: false,
      reason: 'driver not loaded',
      driver_version: null,
      devices: []
    });
    expect(sample.available).toBe(false);
    expect(sample.reason).toBe('driver not loaded');
  });

  it('names the path of a malformed field', () => {
    const bad = fixture('sample.json');
    bad.devices[1].memory_used_bytes = '4 GiB';
    expect(() => parseSample(bad)).toThrow(WireFormatError);
    expect(() => parseSample(bad)).toThrow('.devices[1].memory_used_bytes');
  });

  it('reads a history answer, paged or from an older server', () => {
    const sample = fixture('sample.json');
    const history = parseHistory({ interval_s: 1, samples: [sample, sample], next_since: 5 });
    expect(history.samples).toHaveLength(2);
    expect(history.next_since).toBe(5);
    expect(parseHistory({ interval_s: 1, samples: [] }).next_since).toBeNull();
  });
});

describe('parseMemoryHistory', () => {
  it('reads the points the sparklines draw, as a polled sample makes them', () => {
    const sample = parseSample(fixture('sample.json'));
    const point = memoryPoint(sample);
    expect(point).toEqual({
      time: sample.time,
      devices: [
        { index: 0, memory_used_bytes: 17716740096 },
        { index: 1, memory_used_bytes: 4311744512 }
      ]
    });
    const history = parseMemoryHistory({ interval_s: 0.25, points: [point], next_since: null });
    expect(history).toEqual({ interval_s: 0.25, points: [point], next_since: null });
  });

  it('names the path of a malformed point, and refuses an answer without points', () => {
    const bad = { interval_s: 1, points: [{ time: 1, devices: [{ index: 'zero' }] }] };
    expect(() => parseMemoryHistory(bad)).toThrow('.points[0].devices[0].index');
    expect(() => parseMemoryHistory({ interval_s: 1, samples: [] })).toThrow(
      'expected an array at .points'
    );
  });
});

describe('parseKernelProcesses', () => {
  it('reads the kernel processes answer', () => {
    const k = parseKernelProcesses({
      kernel_id: 'abc',
      pids: [48211],
      matched_by: 'pid',
      processes: [{ device_index: 0, pid: 48211, command: 'python', memory_bytes: 1 }]
    });
    expect(k.pids).toEqual([48211]);
    expect(k.processes[0].device_index).toBe(0);
    expect(k.matched_by).toBe('pid');
  });
});

describe('parseKernelHost', () => {
  it('reads bytes, and null with a reason where the server could not', () => {
    const known = parseKernelHost({
      kernel_id: 'k',
      pid: 7,
      pids: [7, 9],
      rss_bytes: 314572800,
      host_total_bytes: 17179869184,
      host_available_bytes: 9663676416,
      reason: null
    });
    expect(known.pids).toEqual([7, 9]);
    expect(known.rss_bytes).toBe(314572800);
    const unknown = parseKernelHost({
      kernel_id: 'k',
      pid: null,
      pids: [],
      rss_bytes: null,
      host_total_bytes: null,
      host_available_bytes: null,
      reason: 'no /proc on this platform'
    });
    expect([unknown.pid, unknown.rss_bytes, unknown.reason]).toEqual([
      null,
      null,
      'no /proc on this platform'
    ]);
  });

  it('refuses a wrong shape', () => {
    expect(() => parseKernelHost({ kernel_id: 'k', rss_bytes: '300 MB' })).toThrow(
      'expected a number at .rss_bytes'
    );
  });
});
