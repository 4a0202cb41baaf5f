import {
  ILabShell,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { Panel } from '@lumino/widgets';

import { gpuIcon } from './icons';

/** Plugin and widget ids, also used by the UI tests. */
export const PLUGIN_ID = 'jupyter-gpumem:plugin';
export const SIDEBAR_ID = 'jupyter-gpumem:sidebar';

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'Live GPU memory sidebar and status bar item.',
  autoStart: true,
  optional: [ILabShell],
  activate: (app: JupyterFrontEnd): void => {
    const panel = new Panel();
    panel.id = SIDEBAR_ID;
    panel.addClass('jp-GpuMem-sidebar');
    panel.title.icon = gpuIcon;
    panel.title.caption = 'GPU memory';
    app.shell.add(panel, 'right', { rank: 900 });
  }
};

export default plugin;
