/**
 * Reserved bytes and cache, where they mean something: a CUDA device's caching allocator
 * reserves memory beyond what its tensors hold; the CPU has no such allocator, so its
 * reserved would only repeat allocated, and a cache of 0 B would read as if it meant
 * something. The report's views show a CPU's as a dash that says why, or not at all.
 */
import * as React from 'react';

import { formatBytes, Units } from '../format';
import { IReportDevice } from '../wire';

/** A CPU's reserved and cache cells beside a GPU's: not unknown (`–`), not applicable. */
export const NO_CACHE = '—';

/** Why a CPU device shows no reserved bytes or cache. */
export const NO_CACHE_WHY =
  'the CPU has no caching allocator, so nothing is reserved beyond what its tensors hold';

/** Whether a device has a caching allocator (older reports name CUDA devices by index only). */
export function hasCache(device: IReportDevice): boolean {
  return device.device !== 'cpu';
}

/** A table cell of reserved or cache bytes; the dash and its reason on a device without. */
export function CacheCell(props: {
  device: IReportDevice | null;
  bytes: number | null | undefined;
  units: Units;
}): JSX.Element {
  if (props.device && !hasCache(props.device)) {
    return (
      <td className="jp-GpuMem-num jp-GpuMem-noCache" title={NO_CACHE_WHY}>
        {NO_CACHE}
      </td>
    );
  }
  return <td className="jp-GpuMem-num">{formatBytes(props.bytes, props.units)}</td>;
}
