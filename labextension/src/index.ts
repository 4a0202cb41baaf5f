/**
 * Wiring only: one polling model per page, the sidebar, the status bar item and
 * the settings. The mime renderer for reports is a separate extension (mime.ts).
 */
import {
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';

import { unitPreference, Units } from './format';
import { gpuIcon, GpuModel, GpuSidebar, GpuStatusItem } from './live';
import { answerSession, NotebookReports } from './notebook';
import { serverApi } from './wire';

/** Plugin, widget and command ids, also used by the UI tests. */
export const PLUGIN_ID = 'jupyter-gpumem:plugin';
export const SIDEBAR_ID = 'jupyter-gpumem:sidebar';
export const STATUS_ID = 'jupyter-gpumem:status';
export const OPEN_COMMAND = 'jupyter-gpumem:open-sidebar';

/** The settings of schema/plugin.json. */
interface ISettings {
  interval: number;
  units: Units;
  historyMinutes: number;
}

const DEFAULTS: ISettings = { interval: 1, units: 'GiB', historyMinutes: 5 };

function readSettings(settings: ISettingRegistry.ISettings | null): ISettings {
  if (!settings) {
    return DEFAULTS;
  }
  const units = settings.get('units').composite;
  return {
    interval: Number(settings.get('interval').composite ?? DEFAULTS.interval),
    units: units === 'GB' ? 'GB' : 'GiB',
    historyMinutes: Number(settings.get('historyMinutes').composite ?? DEFAULTS.historyMinutes)
  };
}

/**
 * Point the model at the active notebook's kernel, and keep it in step with that
 * notebook's session (restarts, kernel changes). The report list follows the
 * notebook tracker by itself.
 */
function notebookFollower(model: GpuModel): (panel: NotebookPanel | null) => void {
  let followed: NotebookPanel | null = null;
  const onKernel = () => {
    model.kernelId = followed?.sessionContext.session?.kernel?.id ?? null;
  };
  return panel => {
    if (followed && !followed.isDisposed) {
      followed.sessionContext.kernelChanged.disconnect(onKernel);
      followed.sessionContext.sessionChanged.disconnect(onKernel);
    }
    followed = panel;
    if (panel) {
      panel.sessionContext.kernelChanged.connect(onKernel);
      panel.sessionContext.sessionChanged.connect(onKernel);
      void panel.sessionContext.ready.then(() => panel === followed && onKernel());
    }
    onKernel();
  };
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'Live GPU memory sidebar and status bar item.',
  autoStart: true,
  optional: [INotebookTracker, IStatusBar, ISettingRegistry],
  activate: async (
    app: JupyterFrontEnd,
    notebooks: INotebookTracker | null,
    statusBar: IStatusBar | null,
    registry: ISettingRegistry | null
  ): Promise<void> => {
    let settings: ISettingRegistry.ISettings | null = null;
    if (registry) {
      try {
        settings = await registry.load(PLUGIN_ID);
      } catch (error) {
        console.warn('jupyter-gpumem: settings not loaded, using defaults', error);
      }
    }
    let current = readSettings(settings);
    unitPreference.units = current.units;
    const units = () => current.units;

    const model = new GpuModel({
      api: serverApi(app.serviceManager.serverSettings),
      interval_s: current.interval,
      window_s: current.historyMinutes * 60
    });
    const reports = new NotebookReports({ tracker: notebooks });

    const sidebar = new GpuSidebar({
      model,
      reports,
      units,
      onReveal: () => {
        const panel = reports.notebook;
        if (panel) {
          app.shell.activateById(panel.id);
        }
      }
    });
    sidebar.id = SIDEBAR_ID;
    sidebar.title.icon = gpuIcon;
    sidebar.title.caption = 'GPU memory';
    app.shell.add(sidebar, 'right', { rank: 900 });

    app.commands.addCommand(OPEN_COMMAND, {
      label: 'Show GPU Memory',
      caption: 'Open the GPU memory sidebar',
      icon: gpuIcon,
      execute: () => app.shell.activateById(SIDEBAR_ID)
    });

    if (statusBar) {
      const item = new GpuStatusItem({
        model,
        units,
        onClick: () => void app.commands.execute(OPEN_COMMAND)
      });
      item.id = STATUS_ID;
      statusBar.registerStatusItem(STATUS_ID, { item, align: 'left', rank: 100 });
    }

    if (notebooks) {
      notebooks.forEach(panel => answerSession(panel.sessionContext));
      notebooks.widgetAdded.connect((_, panel) => answerSession(panel.sessionContext));
      const follow = notebookFollower(model);
      notebooks.currentChanged.connect((_, panel) => follow(panel));
      follow(notebooks.currentWidget);
    }

    settings?.changed.connect(() => {
      current = readSettings(settings);
      unitPreference.units = current.units;
      model.interval_s = current.interval;
      sidebar.update();
    });

    void app.restored.then(() => model.start());
  }
};

export default plugin;
