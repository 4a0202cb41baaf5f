import * as React from 'react';

import { fixture, HOSTILE, render } from '../../__tests__/helpers';
import { ITensorRecord, parseReport } from '../../wire';
import {
  formatShape,
  hintMessage,
  LargestFreed,
  LeakHints,
  MAX_NAME_CHARS,
  OomSection,
  shortName,
  TensorTable,
  withCode
} from '../findings';

const GPU = 'report_gpu_training_step.json';
const CPU = 'report_cpu_training_step.json';

/** A tensor record: unknown everything, alive, unless given. */
function tensor(fields: Partial<ITensorRecord>): ITensorRecord {
  const unknown = { name: null, shape: null, dtype: null, nbytes: 1, line: null };
  return { ...unknown, device: 'cuda:0', alive: true, ...fields };
}

describe('formatShape and shortName', () => {
  it('writes shapes with a multiplication sign', () => {
    expect(formatShape([8, 1024])).toBe('8×1024');
    expect(formatShape([4096])).toBe('4096');
    expect(formatShape([])).toBe('scalar');
    expect(formatShape(null)).toBe('–');
  });

  it('keeps names whole up to MAX_NAME_CHARS and shortens longer ones from the left', () => {
    expect(shortName('x')).toBe('x');
    const long = "optimizer.state[model.encoder.layers.11.attention.weight]['exp_avg_sq']";
    expect(long.length).toBeGreaterThan(48); // cut in the middle before
    expect(shortName(long)).toBe(long);
    const longer = 'model.' + 'encoder.'.repeat(20) + "weight['exp_avg_sq']";
    const short = shortName(longer);
    expect(short).toHaveLength(MAX_NAME_CHARS);
    expect(MAX_NAME_CHARS).toBe(120); // as the report's own HTML (its HTML_NAME_WIDTH)
    expect(short).toBe('…' + longer.slice(longer.length - 119));
    expect(short.endsWith("weight['exp_avg_sq']")).toBe(true);
  });
});

describe('withCode', () => {
  it('renders code spans as <code> and the rest as text, without backticks', () => {
    const host = render(
      <div>{withCode('Store `loss.item()` or `loss.detach()` instead, or `del` it.')}</div>
    );
    expect(host.textContent).toBe('Store loss.item() or loss.detach() instead, or del it.');
    expect(Array.from(host.querySelectorAll('code')).map(c => c.textContent)).toEqual([
      'loss.item()',
      'loss.detach()',
      'del'
    ]);
    expect(render(<div>{withCode('no code here')}</div>).innerHTML).toBe(
      '<div>no code here</div>'
    );
  });

  it('leaves a lone backtick as text and never reads HTML inside or outside a span', () => {
    const host = render(<div>{withCode(`a \` b \`${HOSTILE}\` ${HOSTILE}`)}</div>);
    expect(host.querySelector('img, script, [onerror]')).toBeNull();
    // The first backtick pairs with the second; the third has no partner and stays.
    expect(Array.from(host.querySelectorAll('code')).map(c => c.textContent)).toEqual([' b ']);
    expect(host.textContent).toBe(`a  b ${HOSTILE}\` ${HOSTILE}`);
  });
});

describe('TensorTable', () => {
  it('lists the tensors the GPU fixture left alive, largest first', () => {
    const tensors = parseReport(fixture(GPU)).devices[0].tensors.filter(t => t.alive);
    const host = render(<TensorTable tensors={tensors} units="GiB" />);
    const rows = Array.from(host.querySelectorAll('tbody tr')).map(row =>
      Array.from(row.querySelectorAll('td')).map(td => td.textContent)
    );
    expect(rows).toHaveLength(10);
    expect(rows[0]).toEqual([
      "opt.state[model.0.weight]['exp_avg']",
      '4096×1024',
      'float32',
      '16 MiB',
      'cell line 7'
    ]);
    expect(rows[4]).toEqual(['x', '512×1024', 'float32', '2 MiB', 'cell line 4']);
    expect(rows[9]).toEqual(['loss', 'scalar', 'float32', '4 B', 'cell line 5']);
  });

  it('names unnamed tensors, shortens only very long names, full name as a tooltip', () => {
    const long = 'a'.repeat(70) + '.' + 'b'.repeat(70);
    const host = render(
      <TensorTable
        tensors={[
          tensor({ nbytes: 8 }),
          tensor({ name: long, shape: [2], dtype: 'int64', nbytes: 16, line: 'f.py:3' })
        ]}
        units="GiB"
      />
    );
    const names = host.querySelectorAll('td.jp-GpuMem-tensorName');
    expect(names[0].textContent).toBe(shortName(long));
    expect(names[0].textContent).toBe('…' + long.slice(-119));
    expect(names[0].getAttribute('title')).toBe(long);
    expect(names[1].textContent).toBe('(unnamed)');
    expect(names[1].classList.contains('jp-mod-unnamed')).toBe(true);
  });

  it('shows the CPU fixture\'s long optimizer-state names whole, breakable at . [ ]', () => {
    const tensors = parseReport(fixture(CPU)).devices[0].tensors.filter(t => t.alive);
    const host = render(<TensorTable tensors={tensors} units="GiB" />);
    const names = Array.from(host.querySelectorAll('td.jp-GpuMem-tensorName'));
    expect(names.map(td => td.textContent)).toEqual(tensors.map(t => t.name));
    const name =
      "opt.state[model.transformer_encoder.0.feed_forward_intermediate_dense.weight]['exp_avg']";
    expect(names[0].textContent).toBe(name);
    // Where the column is too narrow, the name wraps between its parts, not inside them.
    expect(names[0].innerHTML.split('<wbr>')).toEqual([
      'opt.',
      'state',
      '[model.',
      'transformer_encoder.',
      '0.',
      'feed_forward_intermediate_dense.',
      'weight]',
      "['exp_avg']"
    ]);
  });

  it('sums up the rows past the limit', () => {
    const tensors = Array.from({ length: 15 }, (_, i) =>
      tensor({ name: `t${i}`, shape: [i + 1], dtype: 'uint8', nbytes: 100 - i })
    );
    const host = render(<TensorTable tensors={tensors} units="GiB" />);
    expect(host.querySelectorAll('tr.jp-GpuMem-tensor')).toHaveLength(12);
    const more = host.querySelector('.jp-GpuMem-tensorMore');
    expect(more?.textContent).toBe('… 3 more tensors261 B');
  });

  it('renders hostile tensor names as text, injecting no element', () => {
    const host = render(
      <TensorTable
        tensors={[
          tensor({ name: HOSTILE, shape: [1], dtype: HOSTILE, device: HOSTILE, line: HOSTILE })
        ]}
        units="GiB"
      />
    );
    expect(host.querySelector('img, script, [onerror]')).toBeNull();
    expect(host.querySelector('td.jp-GpuMem-tensorName')?.textContent).toBe(HOSTILE);
    expect(host.querySelector('td.jp-GpuMem-tensorName')?.getAttribute('title')).toBe(HOSTILE);
  });
});

describe('LargestFreed', () => {
  it('says how much the largest freed tensor was and where it came from', () => {
    const tensors = parseReport(fixture(GPU)).devices[0].tensors;
    const host = render(<LargestFreed tensors={tensors} units="GiB" />);
    expect(host.textContent).toBe('Largest freed: 16 MiB from cell line 7');
  });

  it('names the freed tensor when it is known, and is absent without freed tensors', () => {
    const host = render(
      <LargestFreed
        tensors={[
          tensor({ name: 'h', shape: [8, 1024], dtype: 'bfloat16', nbytes: 16384, alive: false })
        ]}
        units="GiB"
      />
    );
    expect(host.textContent).toBe(
      'Largest freed: 16 KiB (h 8×1024 bfloat16) from an unknown line'
    );
    const none = render(<LargestFreed tensors={[]} units="GiB" />);
    expect(none.textContent).toBe('');
  });
});

/** The GPU fixture's device as if its cell had run out of memory. */
function oomOf(raw: any) {
  return {
    requested_bytes: 2 * 2 ** 30,
    breakdown: { activations: 6 * 2 ** 30, parameters: 2 ** 30, optimizer_state: 2 * 2 ** 30 },
    dominant: 'activations',
    advice: "activation checkpointing of the model's blocks (or a smaller batch, or bf16 autocast)",
    largest: raw.devices[0].tensors.slice(0, 3)
  };
}

describe('OomSection', () => {
  it('shows the request, the dominant category, the advice and the largest live tensors', () => {
    const raw = fixture(GPU);
    raw.devices[0].oom = oomOf(raw);
    const oom = parseReport(raw).devices[0].oom;
    expect(oom).not.toBeNull();
    const host = render(<OomSection oom={oom!} device="cuda:0" units="GiB" />);
    const text = host.textContent ?? '';
    expect(text).toContain('Out of memory on cuda:0, asking for 2 GiB');
    expect(text).toContain('Most of what was live: Activations (6 GiB)');
    expect(text).toContain("Try: activation checkpointing of the model's blocks");
    expect(host.querySelectorAll('.jp-GpuMem-stackedBar .jp-GpuMem-seg')).toHaveLength(3);
    expect(text).toContain('Largest live tensors');
    expect(host.querySelectorAll('tr.jp-GpuMem-tensor')).toHaveLength(3);
  });

  it('shows code spans of the advice as <code>', () => {
    const raw = fixture(GPU);
    raw.devices[0].oom = {
      ...oomOf(raw),
      dominant: 'other',
      advice: 'deleting tensors you no longer need (`del x`, `%gpumem free`)'
    };
    const oom = parseReport(raw).devices[0].oom!;
    const host = render(<OomSection oom={oom} device="cuda:0" units="GiB" />);
    const advice = host.querySelector('.jp-GpuMem-oomAdvice');
    expect(advice?.textContent).toBe(
      'Try: deleting tensors you no longer need (del x, %gpumem free)'
    );
    expect(Array.from(advice!.querySelectorAll('code')).map(c => c.textContent)).toEqual([
      'del x',
      '%gpumem free'
    ]);
  });

  it('renders hostile advice and categories as text', () => {
    const raw = fixture('report.json');
    raw.devices[0].oom = {
      requested_bytes: 1,
      breakdown: { [HOSTILE]: 1 },
      dominant: HOSTILE,
      advice: HOSTILE,
      largest: [tensor({ name: HOSTILE })]
    };
    const host = render(
      <OomSection oom={parseReport(raw).devices[0].oom!} device={HOSTILE} units="GiB" />
    );
    expect(host.querySelector('img, script, [onerror]')).toBeNull();
    expect((host.textContent ?? '').split(HOSTILE).length - 1).toBeGreaterThanOrEqual(5);
  });
});

describe('LeakHints', () => {
  const hints = [
    {
      kind: 'output-cache',
      bytes: 512 * 2 ** 20,
      message: 'Out[3] keeps a 512 MiB tensor alive.',
      fix: 'Run `%gpumem free` or end the cell with `;`.',
      where: ['Out[3]', '_']
    },
    { kind: 'growth', bytes: null, message: 'Each run adds memory.', fix: '', where: [] }
  ];

  it('lists each hint with its message and fix, code spans as <code>', () => {
    const report = parseReport({ ...fixture(GPU), leak_hints: hints });
    const host = render(<LeakHints hints={report.leak_hints} units="GiB" />);
    const items = host.querySelectorAll('li.jp-GpuMem-leak');
    expect(items).toHaveLength(2);
    expect(items[0].textContent).toBe(
      'output-cache512 MiBOut[3] keeps a 512 MiB tensor alive.' +
        'Fix: Run %gpumem free or end the cell with ;.held by Out[3], _'
    );
    expect(host.textContent).not.toContain('`');
    const fix = items[0].querySelector('.jp-GpuMem-leakFix');
    expect(Array.from(fix!.querySelectorAll('code')).map(c => c.textContent)).toEqual([
      '%gpumem free',
      ';'
    ]);
    expect(items[1].textContent).toBe('growthEach run adds memory.');
  });

  it('shows the CPU fixture\'s recorded hint without its backticks', () => {
    const { leak_hints } = parseReport(fixture(CPU));
    expect(leak_hints[0].fix).toContain('`loss.item()`');
    const host = render(<LeakHints hints={leak_hints} units="GiB" />);
    const fix = host.querySelector('.jp-GpuMem-leakFix');
    expect(fix?.textContent).toBe(
      'Fix: Store loss.item() or loss.detach() instead (e.g. when logging losses), ' +
        'or del the variable once backward() is done.'
    );
    expect(Array.from(fix!.querySelectorAll('code')).map(c => c.textContent)).toEqual([
      'loss.item()',
      'loss.detach()',
      'del'
    ]);
    expect(host.querySelector('.jp-GpuMem-leakWhere code')?.textContent).toBe('val_loss');
  });

  it('writes the byte amounts of a template in the chosen units', () => {
    const [hint] = parseReport({
      ...fixture(GPU),
      leak_hints: [
        {
          kind: 'growth',
          bytes: 3 * 10 ** 9,
          message: 'train grows by 2.79 GiB per run (+8.38 GiB over the last 4 runs).',
          template: 'train grows by {bytes} per run (+{total} over the last 4 runs) {{x}}.',
          amounts: { bytes: 3 * 10 ** 9, total: 9 * 10 ** 9 },
          fix: '',
          where: ['train']
        }
      ]
    }).leak_hints;
    expect(hintMessage(hint, 'GB')).toBe(
      'train grows by 3 GB per run (+9 GB over the last 4 runs) {x}.'
    );
    expect(hintMessage(hint, 'GiB')).toContain('grows by 2.79 GiB per run (+8.38 GiB');
    const host = render(<LeakHints hints={[hint]} units="GB" />);
    expect(host.querySelector('.jp-GpuMem-leakMessage')?.textContent).toContain(
      'grows by 3 GB per run'
    );
  });

  it('renders nothing without hints (the fixtures have none)', () => {
    for (const name of [GPU, 'report.json']) {
      const { leak_hints } = parseReport(fixture(name));
      const host = render(<LeakHints hints={leak_hints} units="GiB" />);
      expect(host.textContent).toBe('');
    }
  });

  it('renders hostile messages, fixes and holders as text, injecting no element', () => {
    const host = render(
      <LeakHints
        hints={[{ kind: HOSTILE, bytes: 1, message: HOSTILE, fix: HOSTILE, where: [HOSTILE] }]}
        units="GiB"
      />
    );
    expect(host.querySelector('img, script, [onerror]')).toBeNull();
    expect((host.textContent ?? '').split(HOSTILE).length - 1).toBe(4);
  });

  it('renders hostile text inside code spans as text too', () => {
    const host = render(
      <LeakHints
        hints={[
          {
            kind: 'x',
            bytes: null,
            message: `\`${HOSTILE}\``,
            fix: `Run \`${HOSTILE}\` then ${HOSTILE}`,
            where: []
          }
        ]}
        units="GiB"
      />
    );
    expect(host.querySelector('img, script, [onerror]')).toBeNull();
    expect(Array.from(host.querySelectorAll('code')).map(c => c.textContent)).toEqual([
      HOSTILE,
      HOSTILE
    ]);
    expect(host.querySelector('.jp-GpuMem-leakFix')?.textContent).toBe(
      `Fix: Run ${HOSTILE} then ${HOSTILE}`
    );
  });
});
