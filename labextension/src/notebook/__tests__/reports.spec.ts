/**
 * The report list follows outputs as they arrive: a real notebook model (cells,
 * output areas), no browser. The tracker and panels are minimal stand-ins.
 */
import { ICodeCellModel } from '@jupyterlab/cells';
import { INotebookTracker, NotebookModel, NotebookPanel } from '@jupyterlab/notebook';
import { ISignal, Signal } from '@lumino/signaling';

import { fixture } from '../../__tests__/helpers';
import { REPORT_MIME_TYPE } from '../../wire';
import { NotebookReports, NotebookWatcher } from '../reports';

// Yjs warns while @jupyter/ydoc builds a cell before inserting it: upstream noise.
const YJS_NOISE = /^(Invalid access: Add Yjs type|\[yjs#509\])/;
const warn = console.warn.bind(console);
beforeAll(() => {
  jest.spyOn(console, 'warn').mockImplementation((...args: unknown[]) => {
    if (!YJS_NOISE.test(String(args[0]))) {
      warn(...args);
    }
  });
});
afterAll(() => jest.restoreAllMocks());

function report(name: string, execution_count: number): any {
  return { ...fixture('report.json'), id: name, name, execution_count, started_at: execution_count };
}

function reportOutput(r: any) {
  return {
    output_type: 'display_data',
    metadata: {},
    data: { [REPORT_MIME_TYPE]: r, 'text/plain': `report ${r.name}` }
  };
}

function streamOutput(text: string) {
  return { output_type: 'stream', name: 'stdout', text };
}

/** A notebook model with the given cells (`code` or `markdown`). */
function notebook(...types: Array<'code' | 'markdown'>): NotebookModel {
  const model = new NotebookModel();
  types.forEach((cell_type, i) =>
    model.sharedModel.insertCell(i, { cell_type, source: '', id: `cell-${i}` })
  );
  return model;
}

function codeCell(model: NotebookModel, index: number): ICodeCellModel {
  return model.cells.get(index) as ICodeCellModel;
}

/** Counts the emissions of a signal. */
function counter(signal: ISignal<any, void>): { n: number } {
  const count = { n: 0 };
  signal.connect(() => {
    count.n++;
  });
  return count;
}

describe('NotebookWatcher', () => {
  let model: NotebookModel;
  let watcher: NotebookWatcher;

  afterEach(() => {
    watcher?.dispose();
    model?.dispose();
    jest.useRealTimers();
  });

  it('lists a report as soon as a cell outputs it, and drops it when cleared', () => {
    model = notebook('code', 'markdown', 'code');
    watcher = new NotebookWatcher(model);
    const changed = counter(watcher.changed);
    expect(watcher.entries).toEqual([]);
    expect(watcher.followedCells).toBe(2);

    codeCell(model, 2).outputs.add(reportOutput(report('train', 3)));
    watcher.flush();
    expect(watcher.entries.map(e => [e.report.name, e.cellId, e.cellIndex])).toEqual([
      ['train', 'cell-2', 2]
    ]);
    expect(changed.n).toBe(1);

    codeCell(model, 0).outputs.add(streamOutput('before\n'));
    codeCell(model, 0).outputs.add(reportOutput(report('eval', 4)));
    watcher.flush();
    expect(watcher.entries.map(e => e.report.name)).toEqual(['eval', 'train']);

    // Re-running a cell clears its outputs first.
    codeCell(model, 2).outputs.clear();
    watcher.flush();
    expect(watcher.entries.map(e => e.report.name)).toEqual(['eval']);
    expect(changed.n).toBe(3);
  });

  it('waits for a burst of outputs to end, and ignores outputs without reports', () => {
    jest.useFakeTimers();
    model = notebook('code');
    watcher = new NotebookWatcher(model, { debounce_ms: 100 });
    const changed = counter(watcher.changed);
    const outputs = codeCell(model, 0).outputs;
    for (let i = 0; i < 20; i++) {
      outputs.add(streamOutput(`step ${i}\n`));
    }
    jest.advanceTimersByTime(150);
    expect(changed.n).toBe(0); // streamed text changes no report

    outputs.add(reportOutput(report('train', 5)));
    jest.advanceTimersByTime(50);
    expect(watcher.entries).toHaveLength(0);
    jest.advanceTimersByTime(60);
    expect(watcher.entries.map(e => e.report.name)).toEqual(['train']);
    expect(changed.n).toBe(1);
  });

  it('follows cells added, removed and turned into markdown', () => {
    model = notebook('code');
    watcher = new NotebookWatcher(model);
    codeCell(model, 0).outputs.add(reportOutput(report('first', 1)));
    watcher.flush();

    model.sharedModel.insertCell(1, {
      cell_type: 'code',
      id: 'added',
      source: '',
      outputs: [reportOutput(report('loaded', 2))]
    });
    watcher.flush();
    expect(watcher.followedCells).toBe(2);
    expect(watcher.entries.map(e => e.report.name)).toEqual(['loaded', 'first']);

    // The added cell's outputs are followed too.
    codeCell(model, 1).outputs.add(reportOutput(report('later', 6)));
    watcher.flush();
    expect(watcher.entries.map(e => e.report.name)).toEqual(['later', 'loaded', 'first']);

    model.sharedModel.deleteCell(0);
    watcher.flush();
    expect(watcher.followedCells).toBe(1);
    expect(watcher.entries.map(e => [e.report.name, e.cellIndex])).toEqual([
      ['later', 0],
      ['loaded', 0]
    ]);

    // Changing a cell's type replaces its model: the code cell's reports go.
    model.sharedModel.transact(() => {
      model.sharedModel.deleteCell(0);
      model.sharedModel.insertCell(0, { cell_type: 'markdown', id: 'added', source: '' });
    });
    watcher.flush();
    expect(watcher.followedCells).toBe(0);
    expect(watcher.entries).toEqual([]);
  });

  it('reads a notebook loaded from JSON, and skips malformed reports', () => {
    model = new NotebookModel();
    watcher = new NotebookWatcher(model);
    model.fromJSON({
      nbformat: 4,
      nbformat_minor: 5,
      metadata: {},
      cells: [
        {
          cell_type: 'code',
          id: 'a',
          source: '',
          metadata: {},
          execution_count: 1,
          outputs: [reportOutput(report('saved', 1)), reportOutput('not a report' as any)]
        }
      ]
    });
    watcher.flush();
    expect(watcher.entries.map(e => e.report.name)).toEqual(['saved']);
    expect(console.warn).toHaveBeenCalledWith(
      expect.stringContaining('skipping a malformed report'),
      expect.anything()
    );
  });

  it('lets go of every cell when disposed', () => {
    jest.useFakeTimers();
    model = notebook('code', 'code');
    watcher = new NotebookWatcher(model);
    const changed = counter(watcher.changed);
    codeCell(model, 0).outputs.add(reportOutput(report('pending', 1)));
    watcher.dispose();
    expect(watcher.followedCells).toBe(0);
    codeCell(model, 1).outputs.add(reportOutput(report('after', 2)));
    model.sharedModel.insertCell(2, { cell_type: 'code', source: '' });
    jest.advanceTimersByTime(1000);
    expect(changed.n).toBe(0);
  });
});

/** The parts of a NotebookPanel that NotebookReports uses. */
class FakePanel {
  constructor(readonly label: string) {
    this.context = { model: notebook('code', 'code'), ready: Promise.resolve() };
  }
  context: { model: NotebookModel; ready: Promise<void> };
  title = { label: this.label };
  disposed = new Signal<this, void>(this);
  isDisposed = false;
  dispose(): void {
    this.isDisposed = true;
    this.disposed.emit();
    this.context.model.dispose();
  }
  asPanel(): NotebookPanel {
    return this as unknown as NotebookPanel;
  }
}

/** The parts of an INotebookTracker that NotebookReports uses. */
class FakeTracker {
  widgetAdded = new Signal<this, NotebookPanel>(this);
  currentChanged = new Signal<this, NotebookPanel | null>(this);
  currentWidget: NotebookPanel | null = null;
  panels: NotebookPanel[] = [];
  forEach(fn: (panel: NotebookPanel) => void): void {
    this.panels.forEach(fn);
  }
  open(panel: FakePanel): void {
    this.panels.push(panel.asPanel());
    this.widgetAdded.emit(panel.asPanel());
    this.focus(panel);
  }
  focus(panel: FakePanel | null): void {
    this.currentWidget = panel?.asPanel() ?? null;
    this.currentChanged.emit(this.currentWidget);
  }
  asTracker(): INotebookTracker {
    return this as unknown as INotebookTracker;
  }
}

describe('NotebookReports', () => {
  afterEach(() => jest.useRealTimers());

  it('follows every open notebook and lists the current one', () => {
    jest.useFakeTimers();
    const tracker = new FakeTracker();
    const already = new FakePanel('already.ipynb');
    tracker.panels.push(already.asPanel());
    const reports = new NotebookReports({ tracker: tracker.asTracker(), debounce_ms: 10 });
    expect(reports.watchedCount).toBe(1);
    expect(reports.notebook).toBeNull();

    const a = new FakePanel('a.ipynb');
    const b = new FakePanel('b.ipynb');
    tracker.open(a);
    tracker.open(b);
    expect(reports.watchedCount).toBe(3);
    expect(reports.notebook?.title.label).toBe('b.ipynb');
    const changed = counter(reports.changed);

    // A report arriving in the current notebook updates the list.
    codeCell(b.context.model, 1).outputs.add(reportOutput(report('in b', 2)));
    jest.advanceTimersByTime(20);
    expect(reports.entries.map(e => e.report.name)).toEqual(['in b']);
    expect(changed.n).toBe(1);

    // One arriving in a notebook in the background is kept, without a change signal.
    codeCell(a.context.model, 0).outputs.add(reportOutput(report('in a', 1)));
    jest.advanceTimersByTime(20);
    expect(changed.n).toBe(1);
    expect(reports.entriesOf(a.asPanel()).map(e => e.report.name)).toEqual(['in a']);

    tracker.focus(a);
    expect(reports.entries.map(e => e.report.name)).toEqual(['in a']);
    expect(changed.n).toBeGreaterThan(1);

    reports.dispose();
    [already, a, b].forEach(p => p.dispose());
  });

  it('stops following a closed notebook', () => {
    const tracker = new FakeTracker();
    const reports = new NotebookReports({ tracker: tracker.asTracker() });
    const a = new FakePanel('a.ipynb');
    const b = new FakePanel('b.ipynb');
    tracker.open(a);
    tracker.open(b);
    codeCell(b.context.model, 0).outputs.add(reportOutput(report('in b', 1)));
    reports.setNotebook(b.asPanel());

    tracker.currentWidget = a.asPanel();
    b.dispose();
    expect(reports.watchedCount).toBe(1);
    expect(reports.notebook?.title.label).toBe('a.ipynb');
    expect(reports.entriesOf(b.asPanel())).toEqual([]);

    tracker.currentWidget = null;
    a.dispose();
    expect(reports.watchedCount).toBe(0);
    expect(reports.notebook).toBeNull();
    expect(reports.entries).toEqual([]);
    reports.dispose();
  });

  it('works without a tracker, for one notebook set by hand', () => {
    const reports = new NotebookReports();
    const a = new FakePanel('a.ipynb');
    codeCell(a.context.model, 0).outputs.add(reportOutput(report('here', 1)));
    reports.setNotebook(a.asPanel());
    expect(reports.entries.map(e => e.report.name)).toEqual(['here']);
    reports.setNotebook(null);
    expect(reports.entries).toEqual([]);
    reports.dispose();
    a.dispose();
  });
});
