/**
 * Notebooks whose outputs carry report bundles, for the UI tests: no kernel execution is
 * needed to render a report.
 */
import { IJupyterLabPageFixture } from '@jupyterlab/galata';
import * as fs from 'fs';
import * as path from 'path';

export const REPORT_MIME = 'application/vnd.jupyter-gpumem.report+json';
const FIXTURES = path.resolve(__dirname, '..', '..', '..', 'tests', 'fixtures');

/** A report saved under tests/fixtures/. */
export function fixture(name: string): any {
  return JSON.parse(fs.readFileSync(path.join(FIXTURES, name), 'utf-8'));
}

/** A code cell whose one output is `report` (and any other representations in `data`). */
export function reportCell(
  id: string,
  source: string,
  report: any,
  data: Record<string, string> = {}
): Record<string, unknown> {
  return {
    cell_type: 'code',
    id,
    execution_count: report.execution_count,
    metadata: {},
    source,
    outputs: [
      { output_type: 'display_data', metadata: {}, data: { [REPORT_MIME]: report, ...data } }
    ]
  };
}

/** An nbformat 4 notebook of `cells`, as JSON text. */
export function notebook(cells: Record<string, unknown>[]): string {
  return JSON.stringify({
    nbformat: 4,
    nbformat_minor: 5,
    metadata: {
      kernelspec: { name: 'python3', display_name: 'Python 3', language: 'python' }
    },
    cells
  });
}

/** Upload `content` as `name` in the test's folder, open it and make it the active tab. */
export async function openNotebook(
  page: IJupyterLabPageFixture,
  tmpPath: string,
  name: string,
  content: string
): Promise<void> {
  await page.contents.uploadContent(content, 'text', `${tmpPath}/${name}`);
  await page.notebook.openByPath(`${tmpPath}/${name}`);
  await page.notebook.activate(name);
}
