import { Poll } from '@lumino/polling';

import { fixture } from '../../__tests__/helpers';
import {
  IGpuApi,
  IKernelHost,
  IKernelProcesses,
  IMemoryHistory,
  ISample,
  memoryPoint,
  parseSample
} from '../../wire';
import { busiestDevice, GpuModel, MAX_BACKFILL_PAGES } from '../model';

function sampleAt(time: number, used0 = 17716740096): ISample {
  const sample = parseSample(fixture('sample.json'));
  sample.time = time;
  sample.devices[0].memory_used_bytes = used0;
  return sample;
}

/** A fake server whose answers the test scripts, one call at a time. */
class FakeApi implements IGpuApi {
  samples: Array<ISample | Error> = [];
  /** The pages of history, answered in turn (the last one again once they run out). */
  historyPages: Array<IMemoryHistory | Error> = [{ interval_s: 1, points: [], next_since: null }];
  kernelAnswer: IKernelProcesses | Error = new Error('404 unknown kernel');
  hostAnswer: IKernelHost | Error = new Error('404 unknown kernel');
  calls = {
    sample: 0,
    history: [] as Array<[number, number]>,
    kernel: [] as string[],
    host: [] as string[]
  };

  async sample(): Promise<ISample> {
    this.calls.sample++;
    const next = this.samples.shift();
    if (!next) {
      throw new Error('no more samples scripted');
    }
    if (next instanceof Error) {
      throw next;
    }
    return next;
  }

  async memoryHistory(since: number, step_s: number): Promise<IMemoryHistory> {
    this.calls.history.push([since, step_s]);
    const page = this.historyPages.length > 1 ? this.historyPages.shift()! : this.historyPages[0];
    if (page instanceof Error) {
      throw page;
    }
    return page;
  }

  async kernelProcesses(kernelId: string): Promise<IKernelProcesses> {
    this.calls.kernel.push(kernelId);
    if (this.kernelAnswer instanceof Error) {
      throw this.kernelAnswer;
    }
    return this.kernelAnswer;
  }

  async kernelHost(kernelId: string): Promise<IKernelHost> {
    this.calls.host.push(kernelId);
    if (this.hostAnswer instanceof Error) {
      throw this.hostAnswer;
    }
    return this.hostAnswer;
  }
}

const HOST: IKernelHost = {
  kernel_id: 'k1',
  pid: 4321,
  pids: [4321, 4330],
  rss_bytes: 300 * 2 ** 20,
  host_total_bytes: 16 * 2 ** 30,
  host_available_bytes: 9 * 2 ** 30,
  reason: null
};

/** Resolve once the poll reaches one of the given phases. */
function phase(poll: Poll, ...phases: string[]): Promise<string> {
  return new Promise(resolve => {
    const check = (_: unknown, state: { phase: string }) => {
      if (phases.includes(state.phase)) {
        poll.ticked.disconnect(check);
        resolve(state.phase);
      }
    };
    poll.ticked.connect(check);
  });
}

describe('GpuModel', () => {
  let api: FakeApi;
  let model: GpuModel;

  beforeEach(() => {
    api = new FakeApi();
    model = new GpuModel({ api, interval_s: 1, window_s: 60, standby: 'never' });
  });

  afterEach(() => {
    model.dispose();
    jest.restoreAllMocks();
  });

  it('polls a sample and backfills the sparkline from the history', async () => {
    api.samples.push(sampleAt(1000));
    const points = [sampleAt(930), sampleAt(980, 5), sampleAt(990)].map(memoryPoint);
    api.historyPages = [{ interval_s: 1, points, next_since: null }];
    const done = phase(model.poll, 'resolved', 'rejected');
    void model.start();
    expect(await done).toBe('resolved');
    expect(model.error).toBeNull();
    expect(model.sample?.time).toBe(1000);
    // The window's points, one per poll interval (1 s).
    expect(api.calls.history).toEqual([[940, 1]]);
    // 930 is older than the 60 s window and is dropped.
    expect(model.history.map(s => s.time)).toEqual([980, 990, 1000]);
    expect(model.series(0)).toEqual([
      { time: 980, used_bytes: 5 },
      { time: 990, used_bytes: 17716740096 },
      { time: 1000, used_bytes: 17716740096 }
    ]);
  });

  it('asks for the pages of the history one after the other', async () => {
    api.samples.push(sampleAt(1000));
    const page = (times: number[], next_since: number | null): IMemoryHistory => ({
      interval_s: 1,
      points: times.map(t => memoryPoint(sampleAt(t))),
      next_since
    });
    api.historyPages = [page([950, 960], 960), page([970, 980], 980), page([990], null)];
    const done = phase(model.poll, 'resolved', 'rejected');
    void model.start();
    expect(await done).toBe('resolved');
    expect(api.calls.history).toEqual([
      [940, 1],
      [960, 1],
      [980, 1]
    ]);
    expect(model.history.map(s => s.time)).toEqual([950, 960, 970, 980, 990, 1000]);
  });

  it('asks for a bounded number of pages, and keeps those that came before a failure', async () => {
    api.samples.push(sampleAt(1000), sampleAt(1001));
    let next = 941;
    api.historyPages = [];
    for (let n = 0; n < MAX_BACKFILL_PAGES + 5; n++) {
      api.historyPages.push({ interval_s: 1, points: [], next_since: next++ });
    }
    let done = phase(model.poll, 'resolved', 'rejected');
    void model.start();
    expect(await done).toBe('resolved');
    expect(api.calls.history).toHaveLength(MAX_BACKFILL_PAGES);

    // A fresh model, whose second page fails: the first page's points stay.
    model.dispose();
    model = new GpuModel({ api, interval_s: 2, window_s: 60, standby: 'never' });
    api.calls.history = [];
    api.historyPages = [
      { interval_s: 1, points: [memoryPoint(sampleAt(950))], next_since: 950 },
      new Error('502 Bad Gateway')
    ];
    done = phase(model.poll, 'resolved', 'rejected');
    void model.start();
    expect(await done).toBe('resolved');
    expect(api.calls.history).toEqual([
      [941, 2],
      [950, 2]
    ]);
    expect(model.history.map(s => s.time)).toEqual([950, 1001]);
  });

  it('throws from the factory on errors, so that the poll backs off, and recovers', async () => {
    jest.useFakeTimers();
    try {
      // The largest wait the randomised backoff allows, so that the growth is exact (x3).
      jest.spyOn(Math, 'random').mockReturnValue(1 - 1e-12);
      const fail = () => new Error('502 Bad Gateway');
      api.samples.push(sampleAt(1000), fail(), fail(), fail(), fail(), sampleAt(1060));
      const phases: Array<[string, number]> = [];
      model.poll.ticked.connect((_, state) => phases.push([state.phase, state.interval]));

      void model.start();
      await jest.advanceTimersByTimeAsync(0);
      expect(model.error).toBeNull();
      for (const wait of [1000, 3000, 9000, 27000]) {
        await jest.advanceTimersByTimeAsync(wait);
      }
      expect(model.error).toBe('502 Bad Gateway');
      // Each failure triples the wait, up to the 30 s maximum.
      expect(phases.filter(([p]) => p === 'rejected').map(([, i]) => i)).toEqual([
        3000, 9000, 27000, 30000
      ]);
      expect(model.sample?.time).toBe(1000); // the last good sample stays shown

      await jest.advanceTimersByTimeAsync(30000);
      expect(model.error).toBeNull();
      expect(model.sample?.time).toBe(1060);
      expect(model.poll.state.phase).toBe('reconnected');
      expect(model.poll.state.interval).toBe(1000);
      expect(api.calls.sample).toBe(6);
    } finally {
      jest.useRealTimers();
    }
  });

  it('never waits longer than the backoff maximum', () => {
    model.interval_s = 0.01;
    expect(model.interval_s).toBe(0.25);
    expect(model.poll.frequency.backoff).toBe(true);
    expect(model.poll.frequency.max).toBe(30000);
  });

  it('pauses while the tab is hidden by default', () => {
    const m = new GpuModel({ api });
    expect(m.poll.standby).toBe('when-hidden');
    m.dispose();
  });

  it("highlights the active kernel's processes and survives a failing lookup", async () => {
    api.samples.push(sampleAt(1000), sampleAt(1001));
    api.kernelAnswer = {
      kernel_id: 'k1',
      pids: [48211],
      matched_by: 'pid',
      processes: [{ device_index: 0, pid: 48211, command: 'python', memory_bytes: 1 }]
    };
    model.kernelId = 'k1';
    let done = phase(model.poll, 'resolved', 'rejected');
    void model.start();
    expect(await done).toBe('resolved');
    expect(api.calls.kernel).toEqual(['k1']);
    expect([...model.kernelPids]).toEqual([48211]);

    api.kernelAnswer = new Error('404');
    done = phase(model.poll, 'resolved', 'rejected');
    void model.poll.refresh();
    expect(await done).toBe('resolved');
    expect(model.kernelProcesses).toBeNull();
    expect(model.kernelPids.size).toBe(0);
    expect(model.error).toBeNull();
  });

  it("reads the kernel's host memory, with or without a GPU", async () => {
    const noGpu = { ...sampleAt(1000), available: false, reason: 'library not found', devices: [] };
    api.samples.push(noGpu, noGpu);
    api.hostAnswer = HOST;
    model.kernelId = 'k1';
    let done = phase(model.poll, 'resolved', 'rejected');
    void model.start();
    expect(await done).toBe('resolved');
    expect(model.kernelHost?.rss_bytes).toBe(300 * 2 ** 20);
    // Without GPUs there are no GPU processes to ask about.
    expect(api.calls.kernel).toEqual([]);
    expect(api.calls.host).toEqual(['k1']);

    // A failing lookup leaves it unknown without failing the poll.
    api.hostAnswer = new Error('404');
    done = phase(model.poll, 'resolved', 'rejected');
    void model.poll.refresh();
    expect(await done).toBe('resolved');
    expect(model.kernelHost).toBeNull();
    expect(model.error).toBeNull();
  });

  it('forgets the host memory of the previous kernel at once', async () => {
    api.samples.push(sampleAt(1000));
    api.hostAnswer = HOST;
    model.kernelId = 'k1';
    const done = phase(model.poll, 'resolved', 'rejected');
    void model.start();
    await done;
    expect(model.kernelHost).not.toBeNull();
    model.kernelId = null;
    expect(model.kernelHost).toBeNull();
  });
});

describe('busiestDevice', () => {
  it('picks the highest used/total share', () => {
    const sample = parseSample(fixture('sample.json'));
    // H100: 17.7/85.5 GB (21%); MIG: 4.3/21.2 GB (20%).
    expect(busiestDevice(sample)?.index).toBe(0);
    sample.devices[1].memory_used_bytes = 20e9;
    expect(busiestDevice(sample)?.index).toBe(1);
  });

  it('has none when NVML is unavailable', () => {
    const sample = parseSample(fixture('sample.json'));
    sample.available = false;
    expect(busiestDevice(sample)).toBeNull();
    expect(busiestDevice(null)).toBeNull();
  });
});
