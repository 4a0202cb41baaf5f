/** Shared test helpers: the fixtures both languages read, and a React renderer. */
import * as fs from 'fs';
import * as path from 'path';
import * as React from 'react';
import { act } from 'react';
import { createRoot } from 'react-dom/client';

const FIXTURES = path.resolve(__dirname, '..', '..', '..', 'tests', 'fixtures');

/** The raw JSON of `tests/fixtures/<name>` (shared with the Python tests). */
export function fixture(name: string): any {
  return JSON.parse(fs.readFileSync(path.join(FIXTURES, name), 'utf-8'));
}

/** A string that would run script if it were ever treated as HTML. */
export const HOSTILE = '<img src=x onerror=alert(1)>';

(globalThis as any).IS_REACT_ACT_ENVIRONMENT = true;

/** Render an element into a detached div, synchronously. */
export function render(element: React.ReactElement): HTMLDivElement {
  const host = document.createElement('div');
  document.body.appendChild(host);
  const root = createRoot(host);
  act(() => root.render(element));
  return host;
}

/** Click an element inside React's act(). */
export function click(element: Element): void {
  act(() => {
    (element as HTMLElement).click();
  });
}

/**
 * The headings of ``table`` aligned otherwise than their column's figures (its first body
 * row): a left heading over right-aligned figures reads as the next column's.
 */
export function misaligned(table: Element): string[] {
  const numeric = (e: Element | undefined) => !!e?.classList.contains('jp-GpuMem-num');
  const cells = Array.from(table.querySelectorAll('tbody tr:first-child td'));
  return Array.from(table.querySelectorAll('thead th'))
    .filter((th, i) => numeric(th) !== numeric(cells[i]))
    .map(th => th.textContent ?? '');
}
