/**
 * The `%%gpumem` reports of the open notebooks, read from the cells' report
 * mime outputs: no extra channel to the kernel is needed, and what the sidebar
 * lists is exactly what the notebook shows (saved notebooks included).
 *
 * The notebook model's own `changed` signal says nothing about outputs, so each
 * code cell's output area is followed: the list updates as a cell's report
 * arrives, without reopening the notebook.
 */
import { ICellModel, ICodeCellModel } from '@jupyterlab/cells';
import { INotebookModel, INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { IDisposable } from '@lumino/disposable';
import { ISignal, Signal } from '@lumino/signaling';

import { IModuleTarget, showModule } from '../report';
import { IReport, parseReport, REPORT_MIME_TYPE } from '../wire';

/** One report found in a notebook. */
export interface IReportEntry {
  report: IReport;
  /** The cell's id, stable across moves. */
  cellId: string;
  /** The cell's position when the notebook was scanned. */
  cellIndex: number;
}

/** The parts of a cell the scan needs (a notebook model cell, or nbformat JSON). */
export interface ICellOutputs {
  id: string;
  outputs: ReadonlyArray<{ data?: unknown }>;
}

/**
 * Every parsable report of the given cells, newest first: by `started_at`, then
 * by `execution_count`, then by position (lower cells are assumed to run later).
 * A report that lacks a key sorts after those that have it.
 */
export function collectReports(cells: Iterable<ICellOutputs>): IReportEntry[] {
  const entries: IReportEntry[] = [];
  let cellIndex = 0;
  for (const cell of cells) {
    for (const output of cell.outputs) {
      const data = output.data as Record<string, unknown> | undefined;
      const json = data?.[REPORT_MIME_TYPE];
      if (json === undefined) {
        continue;
      }
      try {
        entries.push({ report: parseReport(json), cellId: cell.id, cellIndex });
      } catch (error) {
        console.warn(`jupyter-gpumem: skipping a malformed report in cell ${cellIndex}`, error);
      }
    }
    cellIndex++;
  }
  return entries.sort(newestFirst);
}

function sortKey(entry: IReportEntry): number[] {
  const { started_at, execution_count } = entry.report;
  return [started_at ?? -Infinity, execution_count ?? -Infinity, entry.cellIndex];
}

function newestFirst(a: IReportEntry, b: IReportEntry): number {
  const ka = sortKey(a);
  const kb = sortKey(b);
  for (let i = 0; i < ka.length; i++) {
    if (ka[i] !== kb[i]) {
      return ka[i] < kb[i] ? 1 : -1;
    }
  }
  return 0;
}

/** The report outputs' raw JSON of one code cell, in output order. */
function reportData(cell: ICodeCellModel): unknown[] {
  const found: unknown[] = [];
  const outputs = cell.outputs;
  for (let j = 0; j < outputs.length; j++) {
    const json = (outputs.get(j).data as Record<string, unknown>)[REPORT_MIME_TYPE];
    if (json !== undefined) {
      found.push(json);
    }
  }
  return found;
}

function sameItems(a: ReadonlyArray<unknown>, b: ReadonlyArray<unknown>): boolean {
  return a.length === b.length && a.every((item, i) => item === b[i]);
}

/** Milliseconds to wait after a change before listing again (outputs arrive in bursts). */
export const DEBOUNCE_MS = 100;

/**
 * The reports of one notebook model, kept up to date as outputs arrive: it
 * follows the cell list (cells added, removed, moved, changed type) and the
 * output area of every code cell. Only cells whose outputs changed are read
 * again, and `changed` is emitted only when a report came, went or moved, so a
 * cell streaming text costs one look at that cell per burst.
 */
export class NotebookWatcher implements IDisposable {
  constructor(model: INotebookModel, options: { debounce_ms?: number } = {}) {
    this._model = model;
    this._debounce_ms = options.debounce_ms ?? DEBOUNCE_MS;
    model.cells.changed.connect(this._onCellsChanged, this);
    this._reconcile();
    this._rebuild();
  }

  /** Emitted when the notebook's list of reports changes. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  get model(): INotebookModel {
    return this._model;
  }

  /** The notebook's reports, newest first. */
  get entries(): ReadonlyArray<IReportEntry> {
    return this._entries;
  }

  /** Code cells whose output area is followed (for the tests). */
  get followedCells(): number {
    return this._cells.size;
  }

  /** Read every cell again now (after a load, or on becoming the current notebook). */
  rescan(): void {
    if (this._isDisposed) {
      return;
    }
    this._cellsChanged = true;
    for (const cell of this._cells.keys()) {
      this._dirty.add(cell);
    }
    this.flush();
  }

  /** Read pending changes now instead of after the debounce (tests, notebook switches). */
  flush(): void {
    if (this._timer !== null) {
      clearTimeout(this._timer);
      this._timer = null;
    }
    if (this._isDisposed) {
      return;
    }
    if (this._cellsChanged) {
      this._reconcile();
    }
    let changed = this._cellsChanged;
    this._cellsChanged = false;
    for (const cell of this._dirty) {
      const state = this._cells.get(cell);
      if (!state) {
        continue;
      }
      const data = reportData(cell);
      if (!sameItems(data, state.data)) {
        state.data = data;
        changed = true;
      }
    }
    this._dirty.clear();
    if (changed) {
      this._rebuild();
      this._changed.emit();
    }
  }

  get isDisposed(): boolean {
    return this._isDisposed;
  }

  dispose(): void {
    if (this._isDisposed) {
      return;
    }
    this._isDisposed = true;
    if (this._timer !== null) {
      clearTimeout(this._timer);
      this._timer = null;
    }
    if (!this._model.isDisposed) {
      this._model.cells.changed.disconnect(this._onCellsChanged, this);
    }
    for (const cell of this._cells.keys()) {
      this._unfollow(cell);
    }
    this._cells.clear();
    this._dirty.clear();
    Signal.clearData(this);
  }

  private _onCellsChanged(): void {
    this._cellsChanged = true;
    this._schedule();
  }

  private _onOutputsChanged(cell: ICodeCellModel): void {
    this._dirty.add(cell);
    this._schedule();
  }

  private _schedule(): void {
    if (this._timer !== null || this._isDisposed) {
      return;
    }
    this._timer = setTimeout(() => {
      this._timer = null;
      this.flush();
    }, this._debounce_ms);
  }

  /**
   * Follow exactly the code cells now in the notebook. The cell list's `remove`
   * events do not say which cells went (their models are disposed by then), so
   * the followed set is compared with the list instead.
   */
  private _reconcile(): void {
    const present = new Set<ICellModel>();
    const cells = this._model.cells;
    for (let i = 0; i < cells.length; i++) {
      const cell = cells.get(i);
      if (!cell || cell.type !== 'code') {
        continue;
      }
      const code = cell as ICodeCellModel;
      present.add(code);
      if (!this._cells.has(code)) {
        this._follow(code);
      }
    }
    for (const cell of [...this._cells.keys()]) {
      if (!present.has(cell)) {
        this._unfollow(cell);
        this._cells.delete(cell);
        this._dirty.delete(cell);
      }
    }
  }

  private _follow(cell: ICodeCellModel): void {
    const listener = () => this._onOutputsChanged(cell);
    this._cells.set(cell, { data: reportData(cell), listener });
    cell.outputs.changed.connect(listener, this);
  }

  private _unfollow(cell: ICodeCellModel): void {
    const state = this._cells.get(cell);
    if (state && !cell.isDisposed) {
      cell.outputs.changed.disconnect(state.listener, this);
    }
  }

  private _rebuild(): void {
    const cells: ICellOutputs[] = [];
    const list = this._model.cells;
    for (let i = 0; i < list.length; i++) {
      const cell = list.get(i);
      const state = cell ? this._cells.get(cell as ICodeCellModel) : undefined;
      // Every cell counts towards the position, code or not.
      const outputs = (state?.data ?? []).map(json => ({ data: { [REPORT_MIME_TYPE]: json } }));
      cells.push({ id: cell?.id ?? '', outputs });
    }
    this._entries = collectReports(cells);
  }

  private _cells = new Map<ICodeCellModel, { data: unknown[]; listener: () => void }>();
  private _cellsChanged = false;
  private _changed = new Signal<this, void>(this);
  private _debounce_ms: number;
  private _dirty = new Set<ICodeCellModel>();
  private _entries: IReportEntry[] = [];
  private _isDisposed = false;
  private _model: INotebookModel;
  private _timer: ReturnType<typeof setTimeout> | null = null;
}

/**
 * The reports of every open notebook, one watcher each (so that switching
 * notebooks shows an up-to-date list at once), and which notebook is current.
 * Follows the tracker: notebooks opened (`widgetAdded`), closed (`disposed`)
 * and focused (`currentChanged`).
 */
export class NotebookReports implements IDisposable {
  constructor(options: { tracker?: INotebookTracker | null; debounce_ms?: number } = {}) {
    this._debounce_ms = options.debounce_ms ?? DEBOUNCE_MS;
    const tracker = options.tracker ?? null;
    this._tracker = tracker;
    if (tracker) {
      tracker.widgetAdded.connect(this._onAdded, this);
      tracker.currentChanged.connect(this._onCurrentChanged, this);
      tracker.forEach(panel => this._watch(panel));
      this.setNotebook(tracker.currentWidget);
    }
  }

  /** Emitted when the current notebook or its list of reports changes. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** The current notebook, whose reports `entries` lists. */
  get notebook(): NotebookPanel | null {
    return this._notebook;
  }

  /** The current notebook's reports, newest first. */
  get entries(): ReadonlyArray<IReportEntry> {
    const watcher = this._notebook ? this._watchers.get(this._notebook) : undefined;
    return watcher?.entries ?? [];
  }

  /** The reports of any open notebook (empty for one that is not followed). */
  entriesOf(panel: NotebookPanel): ReadonlyArray<IReportEntry> {
    return this._watchers.get(panel)?.entries ?? [];
  }

  /** How many notebooks are followed (for the tests). */
  get watchedCount(): number {
    return this._watchers.size;
  }

  /** Make another notebook (or none) current; it is followed from now on if it was not. */
  setNotebook(panel: NotebookPanel | null): void {
    if (panel && panel.isDisposed) {
      panel = null;
    }
    if (panel === this._notebook) {
      return;
    }
    this._notebook = panel;
    if (panel) {
      this._watch(panel)?.rescan();
    }
    this._changed.emit();
  }

  /**
   * Select and scroll to the cell that holds a report; with `module`, then have the
   * report's module section open, zoom to and mark that module (scrolling to its row).
   */
  reveal(entry: IReportEntry, module?: IModuleTarget): boolean {
    const panel = this._notebook;
    if (!panel) {
      return false;
    }
    const widgets = panel.content.widgets;
    const index = widgets.findIndex(cell => cell.model.id === entry.cellId);
    if (index < 0) {
      return false;
    }
    panel.content.activeCellIndex = index;
    panel.content.deselectAll();
    const scrolled = panel.content.scrollToItem(index, 'smart');
    if (module) {
      // The cell's outputs are attached once it is scrolled to (windowed notebooks).
      void scrolled.then(() => {
        const cell = panel.content.widgets.find(c => c.model.id === entry.cellId);
        if (cell && !cell.isDisposed) {
          showModule(cell.node, { reportId: entry.report.id, ...module });
        }
      });
    }
    return true;
  }

  get isDisposed(): boolean {
    return this._isDisposed;
  }

  dispose(): void {
    if (this._isDisposed) {
      return;
    }
    this._isDisposed = true;
    const tracker = this._tracker;
    if (tracker) {
      tracker.widgetAdded.disconnect(this._onAdded, this);
      tracker.currentChanged.disconnect(this._onCurrentChanged, this);
    }
    for (const panel of [...this._watchers.keys()]) {
      this._unwatch(panel);
    }
    this._notebook = null;
    Signal.clearData(this);
  }

  private _onAdded(_: unknown, panel: NotebookPanel): void {
    this._watch(panel);
  }

  private _onCurrentChanged(_: unknown, panel: NotebookPanel | null): void {
    this.setNotebook(panel);
  }

  private _watch(panel: NotebookPanel): NotebookWatcher | null {
    const known = this._watchers.get(panel);
    if (known) {
      return known;
    }
    if (panel.isDisposed || this._isDisposed) {
      return null;
    }
    const watcher = new NotebookWatcher(panel.context.model, {
      debounce_ms: this._debounce_ms
    });
    watcher.changed.connect(this._onWatcherChanged, this);
    panel.disposed.connect(this._onPanelDisposed, this);
    this._watchers.set(panel, watcher);
    // Loading from disk fills the cells after the panel exists; the cell list's
    // `changed` covers that, and this rescan catches anything filled silently.
    void panel.context.ready.then(() => {
      if (this._watchers.get(panel) === watcher) {
        watcher.rescan();
      }
    });
    return watcher;
  }

  private _unwatch(panel: NotebookPanel): void {
    const watcher = this._watchers.get(panel);
    if (!watcher) {
      return;
    }
    this._watchers.delete(panel);
    panel.disposed.disconnect(this._onPanelDisposed, this);
    watcher.dispose();
  }

  private _onWatcherChanged(watcher: NotebookWatcher): void {
    const current = this._notebook ? this._watchers.get(this._notebook) : undefined;
    if (watcher === current) {
      this._changed.emit();
    }
  }

  private _onPanelDisposed(panel: NotebookPanel): void {
    this._unwatch(panel);
    if (panel === this._notebook) {
      this.setNotebook(this._tracker?.currentWidget ?? null);
    }
  }

  private _changed = new Signal<this, void>(this);
  private _debounce_ms: number;
  private _isDisposed = false;
  private _notebook: NotebookPanel | null = null;
  private _tracker: INotebookTracker | null;
  private _watchers = new Map<NotebookPanel, NotebookWatcher>();
}
