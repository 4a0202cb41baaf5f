/**
 * Notebook integration: the `%%gpumem` reports read out of the open notebooks' outputs
 * (reports.ts: the sidebar's list, and revealing a report's cell and module), and the
 * answer to each notebook kernel's comm that this front end draws reports (handshake.ts).
 */
export { answerKernel, answerSession, COMM_TARGET } from './handshake';
export { collectReports, NotebookReports, NotebookWatcher } from './reports';
export type { ICellOutputs, IReportEntry } from './reports';
