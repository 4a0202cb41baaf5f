/**
 * The `%%gpumem` reports of the active notebook, read from the cells' report
 * mime outputs: no extra channel to the kernel is needed, and what the sidebar
 * lists is exactly what the notebook shows (saved notebooks included).
 */
import { ICodeCellModel } from '@jupyterlab/cells';
import { NotebookPanel } from '@jupyterlab/notebook';
import { IDisposable } from '@lumino/disposable';
import { ISignal, Signal } from '@lumino/signaling';

import { IReport, parseReport, REPORT_MIME_TYPE } from './types';

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

/** The cells of a live notebook, in the shape `collectReports` reads. */
export function* notebookCells(panel: NotebookPanel): Iterable<ICellOutputs> {
  const cells = panel.content.model?.cells;
  if (!cells) {
    return;
  }
  for (let i = 0; i < cells.length; i++) {
    const cell = cells.get(i);
    if (cell.type !== 'code') {
      continue;
    }
    const outputs = (cell as ICodeCellModel).outputs;
    const list: Array<{ data?: unknown }> = [];
    for (let j = 0; j < outputs.length; j++) {
      list.push({ data: outputs.get(j).data });
    }
    yield { id: cell.id, outputs: list };
  }
}

/** Follows one notebook at a time and rescans it (debounced) when it changes. */
export class NotebookReports implements IDisposable {
  /** Emitted when the notebook or its list of reports changes. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  get notebook(): NotebookPanel | null {
    return this._notebook;
  }

  get entries(): ReadonlyArray<IReportEntry> {
    return this._entries;
  }

  /** Follow another notebook (or none). */
  setNotebook(panel: NotebookPanel | null): void {
    if (panel === this._notebook) {
      return;
    }
    this._disconnect();
    this._notebook = panel;
    if (panel) {
      panel.disposed.connect(this._onDisposed, this);
      panel.context.model.sharedModel.changed.connect(this._schedule, this);
      void panel.context.ready.then(() => {
        if (this._notebook === panel) {
          this._scan();
        }
      });
    }
    this._scan();
  }

  /** Select, scroll to and focus the cell that holds a report. */
  reveal(entry: IReportEntry): boolean {
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
    void panel.content.scrollToItem(index, 'smart');
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
    this._disconnect();
    Signal.clearData(this);
  }

  private _schedule(): void {
    if (this._timer !== null) {
      return;
    }
    this._timer = setTimeout(() => {
      this._timer = null;
      this._scan();
    }, 100);
  }

  private _scan(): void {
    const panel = this._notebook;
    this._entries = panel ? collectReports(notebookCells(panel)) : [];
    this._changed.emit();
  }

  private _onDisposed(): void {
    this.setNotebook(null);
  }

  private _disconnect(): void {
    if (this._timer !== null) {
      clearTimeout(this._timer);
      this._timer = null;
    }
    const panel = this._notebook;
    if (panel && !panel.isDisposed) {
      panel.disposed.disconnect(this._onDisposed, this);
      panel.context.model.sharedModel.changed.disconnect(this._schedule, this);
    }
  }

  private _changed = new Signal<this, void>(this);
  private _entries: IReportEntry[] = [];
  private _isDisposed = false;
  private _notebook: NotebookPanel | null = null;
  private _timer: ReturnType<typeof setTimeout> | null = null;
}
