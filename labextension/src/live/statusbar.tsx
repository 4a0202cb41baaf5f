/**
 * The status bar item: the busiest GPU's memory, e.g. "GPU 0: 12.3/80 GiB";
 * without a GPU, the active kernel's host memory, e.g. "GPU: n/a · kernel 312 MiB".
 */
import { TextItem } from '@jupyterlab/statusbar';
import { ReactWidget } from '@jupyterlab/ui-components';
import * as React from 'react';

import { formatBytes, formatUsedTotal, Units } from '../format';
import { IKernelHost, ISample } from '../wire';
import { busiestDevice, GpuModel } from './model';
import { whyNoGpu } from './nogpu';

/** The text and tooltip of the item, as a pure function of the model's state. */
export function statusText(
  sample: ISample | null,
  error: string | null,
  units: Units,
  host: IKernelHost | null = null
): { text: string; title: string } {
  if (error && !sample) {
    return { text: 'GPU: offline', title: `GPU monitor unreachable: ${error}` };
  }
  if (!sample) {
    return { text: 'GPU: …', title: 'Reading the GPUs' };
  }
  if (!sample.available) {
    const why = whyNoGpu(sample.reason);
    if (host?.rss_bytes === null || host?.rss_bytes === undefined) {
      return { text: 'GPU: n/a', title: `${why} Click for details.` };
    }
    const rss = formatBytes(host.rss_bytes, units);
    return {
      text: `GPU: n/a · kernel ${rss}`,
      title: `${why} This notebook's kernel holds ${rss} of host memory (RSS). Click for details.`
    };
  }
  const device = busiestDevice(sample);
  if (!device) {
    return { text: 'GPU: none', title: 'NVML sees no GPU' };
  }
  const used = formatUsedTotal(device.memory_used_bytes, device.memory_total_bytes, units);
  const stale = error ? ` (last known; ${error})` : '';
  return {
    text: `GPU ${device.index}: ${used}`,
    title: `Busiest GPU: ${device.name ?? `GPU ${device.index}`}, ${used} used${stale}. Click for details.`
  };
}

export class GpuStatusItem extends ReactWidget {
  constructor(options: { model: GpuModel; units: () => Units; onClick: () => void }) {
    super();
    this._options = options;
    this.addClass('jp-GpuMem-status-item');
    this.node.addEventListener('click', options.onClick);
    options.model.changed.connect(this._onChange, this);
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this.node.removeEventListener('click', this._options.onClick);
    this._options.model.changed.disconnect(this._onChange, this);
    super.dispose();
  }

  protected render(): JSX.Element {
    const { model, units } = this._options;
    const { text, title } = statusText(model.sample, model.error, units(), model.kernelHost);
    this.node.title = title;
    return <TextItem source={text} />;
  }

  private _onChange(): void {
    this.update();
  }

  private _options: { model: GpuModel; units: () => Units; onClick: () => void };
}
