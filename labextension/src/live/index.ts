/**
 * The live view: one polling model of the server's samples (model.ts), shared by the
 * sidebar (sidebar.tsx: a card per GPU, the active kernel's host memory and the active
 * notebook's reports) and the status bar item (statusbar.tsx), and their icon.
 */
export { gpuIcon } from './icons';
export { busiestDevice, GpuModel } from './model';
export type { IPoint } from './model';
export { GpuSidebar } from './sidebar';
export { GpuStatusItem, statusText } from './statusbar';
