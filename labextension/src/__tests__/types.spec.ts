import {
  parseHistory,
  parseKernelProcesses,
  parseReport,
  parseSample,
  WireFormatError
} from '../types';
import { fixture } from './helpers';

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

  it('reads a history answer', () => {
    const sample = fixture('sample.json');
    const history = parseHistory({ interval_s: 1, samples: [sample, sample] });
    expect(history.samples).toHaveLength(2);
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

describe('parseReport', () => {
  it('reads the shared report fixture', () => {
    const report = parseReport(fixture('report.json'));
    expect(report.name).toBe('train');
    expect(report.status).toBe('ok');
    expect(report.wall_s).toBeCloseTo(3.4178);
    expect(report.devices).toHaveLength(1);
    const device = report.devices[0];
    expect(device.peak_allocated_bytes).toBe(15770842432);
    expect(device.breakdown?.activations).toBe(13110968320);
    expect(device.peak_phase).toBe('forward');
    expect(device.peak_step).toBe(2);
  });

  it('is lenient about optional fields', () => {
    const report = parseReport({
      name: null,
      status: 'ok',
      wall_s: 0.01,
      cuda_available: false,
      notes: ['No CUDA device is present: the cell ran unchanged.'],
      devices: []
    });
    expect(report.cuda_available).toBe(false);
    expect(report.warnings).toEqual([]);
    expect(report.notes).toHaveLength(1);
    const device = parseReport({
      status: 'ok',
      devices: [{ index: 0, peak_allocated_bytes: 1 }]
    }).devices[0];
    expect(device.breakdown).toBeNull();
    expect(device.peak_phase).toBeNull();
    expect(device.cache_bytes).toBeNull();
  });

  it('rejects what is not a report', () => {
    expect(() => parseReport('<b>hi</b>')).toThrow(WireFormatError);
    expect(() => parseReport({ status: 'ok', devices: {} })).toThrow('.devices');
  });
});
