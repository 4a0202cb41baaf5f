import { fixture } from '../../__tests__/helpers';
import { WireFormatError } from '../json';
import { parseReport, REPORT_SCHEMAS } from '../report';

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

  it('reads the timeline, tensors and cell key of the report recorded on a GPU', () => {
    const report = parseReport(fixture('report_gpu_training_step.json'));
    expect(report.cell_key).toBe('d0903eadb8517789');
    expect(report.leak_hints).toEqual([]);
    const device = report.devices[0];
    expect(device.name).toBe('NVIDIA H200');
    expect(device.oom).toBeNull();
    const timeline = device.timeline!;
    expect(timeline.t_s).toHaveLength(512);
    expect(timeline.allocated_bytes).toHaveLength(512);
    expect(timeline.reserved_bytes).toHaveLength(512);
    expect(timeline.bands).toHaveLength(9);
    expect(timeline.bands[0]).toEqual({
      start_s: 0.000138,
      end_s: 0.000526,
      phase: 'forward',
      step: 0
    });
    expect(timeline.peak_bytes).toBe(820098048);
    expect(timeline.peak_t_s).toBeCloseTo(0.000603);
    expect(device.tensors).toHaveLength(20);
    expect(device.tensors.filter(t => t.alive)).toHaveLength(10);
    expect(device.tensors[0]).toEqual({
      name: "opt.state[model.0.weight]['exp_avg']",
      shape: [4096, 1024],
      dtype: 'float32',
      nbytes: 16777216,
      device: 'cuda:0',
      line: 'cell line 7',
      alive: true
    });
    expect(device.tensors[9].shape).toEqual([]);
    expect(device.tensors[19]).toMatchObject({ name: null, shape: null, alive: false });
  });

  it('gives the older report fixture empty defaults for the newer fields', () => {
    const report = parseReport(fixture('report.json'));
    expect(report.leak_hints).toEqual([]);
    expect(report.cell_key).toBeNull();
    expect(report.devices[0].timeline).toBeNull();
    expect(report.devices[0].tensors).toEqual([]);
    expect(report.devices[0].oom).toBeNull();
  });

  it('reads OOM info and leak hints, with defaults for what they omit', () => {
    const report = parseReport({
      status: 'oom',
      devices: [
        {
          index: 0,
          oom: { requested_bytes: 1024, dominant: 'activations', largest: [{ nbytes: 8 }] },
          timeline: { t_s: [0, 1], allocated_bytes: [1, 2] }
        }
      ],
      leak_hints: [{ kind: 'growth', message: 'grows' }]
    });
    const oom = report.devices[0].oom!;
    expect(oom.requested_bytes).toBe(1024);
    expect(oom.breakdown).toBeNull();
    expect(oom.advice).toBeNull();
    expect(oom.largest[0]).toEqual({
      name: null,
      shape: null,
      dtype: null,
      nbytes: 8,
      device: null,
      line: null,
      alive: false
    });
    const timeline = report.devices[0].timeline!;
    expect(timeline.reserved_bytes).toEqual([]);
    expect(timeline.bands).toEqual([]);
    expect(timeline.peak_bytes).toBeNull();
    expect(report.leak_hints[0]).toEqual({
      kind: 'growth',
      bytes: null,
      message: 'grows',
      template: null,
      amounts: {},
      fix: '',
      where: []
    });
  });

  it('names the path of a malformed new field', () => {
    const raw = fixture('report_gpu_training_step.json');
    raw.devices[0].timeline.allocated_bytes[3] = 'lots';
    expect(() => parseReport(raw)).toThrow('.devices[0].timeline.allocated_bytes[3]');
    const raw2 = fixture('report_gpu_training_step.json');
    raw2.devices[0].tensors[2].shape = '4096x1024';
    expect(() => parseReport(raw2)).toThrow('.devices[0].tensors[2].shape');
    expect(() => parseReport({ status: 'ok', leak_hints: {} })).toThrow('.leak_hints');
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

  it('reads a generate call with its KV cache, prefill and decode', () => {
    const report = parseReport(fixture('report_gpu_generate.json'));
    expect(report.schema).toBe(3);
    expect(report.name).toBe('generate');
    const device = report.devices[0];
    expect(device.breakdown?.kv_cache).toBeGreaterThan(0);
    expect(device.breakdown).toHaveProperty('library_workspace');
    expect(device.breakdown).toHaveProperty('cuda_graph_pool');
    expect(['prefill', 'decode']).toContain(device.peak_phase);
    const phases = device.timeline!.bands.map(b => b.phase);
    expect(phases[0]).toBe('prefill');
    expect(phases.filter(p => p === 'prefill')).toHaveLength(1);
    expect(phases.filter(p => p === 'decode').length).toBeGreaterThan(1);
  });

  it("reads schema 3: each device's module tree and largest module", () => {
    const device = parseReport(fixture('report_cpu_gpt_step.json')).devices[0];
    const tree = device.module_tree!;
    expect(tree.path).toBe('');
    expect(tree.bytes).toEqual(
      Object.fromEntries(Object.entries(device.breakdown!).filter(([, n]) => n !== 0))
    );
    expect(tree.children.map(c => c.path)).toEqual(['transformer', 'lm_head']);
    const h0 = tree.children[0].children.find(c => c.path === 'transformer.h.0')!;
    expect(h0.children.map(c => c.path)).toEqual([
      'transformer.h.0.ln_1',
      'transformer.h.0.attn',
      'transformer.h.0.ln_2',
      'transformer.h.0.mlp'
    ]);
    expect(h0.bytes.activations).toBe(22036480);
    expect(device.largest_module).toEqual({ path: 'transformer.h.0.mlp.act', bytes: 8388608 });

    const generate = parseReport(fixture('report_gpu_generate.json')).devices[0];
    expect(generate.module_tree?.bytes.kv_cache).toBe(generate.breakdown?.kv_cache);
    expect(generate.largest_module?.path).toBe('transformer.h.1.attn');
  });

  it('reads a device without modules, and refuses a module tree of the wrong shape', () => {
    const bare = parseReport({ status: 'ok', devices: [{ index: 0 }] }).devices[0];
    expect(bare.module_tree).toBeNull();
    expect(bare.largest_module).toBeNull();
    const old = parseReport(fixture('report.json')).devices[0];
    expect([old.module_tree, old.largest_module]).toEqual([null, null]);
    const tree = (children: unknown) => ({
      status: 'ok',
      devices: [{ index: 0, module_tree: { path: '', bytes: { activations: 2 }, children } }]
    });
    expect(() => parseReport(tree([{ path: 'a', bytes: { activations: '1' } }]))).toThrow(
      'expected a number at .devices[0].module_tree.children[0].bytes.activations'
    );
    expect(() => parseReport(tree({}))).toThrow('.devices[0].module_tree.children');
    expect(() =>
      parseReport({ status: 'ok', devices: [{ index: 0, largest_module: { path: 'a' } }] })
    ).toThrow('.devices[0].largest_module.bytes');
  });

  it('reads schema 1 to 3, and a newer schema leniently; refuses what is no schema', () => {
    expect(REPORT_SCHEMAS).toEqual([1, 2, 3]);
    expect(parseReport(fixture('report.json')).schema).toBe(1);
    expect(parseReport(fixture('report_gpu_training_step.json')).schema).toBe(1);
    expect(parseReport(fixture('report_cpu_gpt_step.json')).schema).toBe(3);
    expect(parseReport({ status: 'ok' }).schema).toBeUndefined();
    expect(parseReport({ status: 'ok', schema: 4 }).schema).toBe(4);
    for (const schema of [0, 1.5, '2']) {
      expect(() => parseReport({ status: 'ok', schema })).toThrow('.schema');
    }
  });

  it('rejects what is not a report', () => {
    expect(() => parseReport('<b>hi</b>')).toThrow(WireFormatError);
    expect(() => parseReport({ status: 'ok', devices: {} })).toThrow('.devices');
  });
});
