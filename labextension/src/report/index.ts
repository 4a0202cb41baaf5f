/**
 * The report views: the rich view of a `%%gpumem` report under a cell (renderer.tsx),
 * made of its timeline, breakdown, findings, peak by module and worker ranks. They read
 * the report's wire format (../wire) only. The mime extension (../mime.ts) registers
 * `rendererFactory`; the sidebar names a report's main device (`mainDevice`,
 * `deviceId`) and its largest module (`moduleName`), and the notebook's report list asks
 * a report's module section to show one module (`showModule`).
 */
export {
  deviceId,
  mainDevice,
  RENDERER_RANK,
  rendererFactory,
  ReportRenderer,
  ReportView
} from './renderer';
export { SHOW_MODULE_EVENT, showModule } from './modules';
export { moduleName } from './moduletree';
export type { IModuleTarget } from './modules';
