/**
 * The worker processes a `%%gpumem` cell started (`report.ranks`): one row per rank
 * with a bar of its peak allocated, all on one scale, the worst rank marked; and a rank
 * selector whose rank's own report is shown in full beneath (timeline, breakdown, tensors).
 * A rank that died without a report has a row that says how it ended.
 */
import * as React from 'react';

import { formatBytes, Units } from '../format';
import { IReport, IReportDevice } from '../wire';
import { CacheCell } from './cache';

/** A rank's main device: the one its kernel named, else its first. */
export function rankDevice(rank: IReport): IReportDevice | null {
  return rank.devices.find(d => d.device === rank.main_device) ?? rank.devices[0] ?? null;
}

function peakOf(rank: IReport): number | null {
  const peak = rankDevice(rank)?.peak_allocated_bytes;
  return typeof peak === 'number' ? peak : null;
}

/**
 * The rank with the highest peak allocated: the one the kernel named (`worst_rank`),
 * else the first of the highest; ranks without figures never count.
 */
export function worstRank(report: IReport): IReport | null {
  const ranks = report.ranks ?? [];
  const named = ranks.find(r => r.rank === report.worst_rank && peakOf(r) !== null);
  if (named) {
    return named;
  }
  return ranks.reduce<IReport | null>((worst, r) => {
    const peak = peakOf(r);
    return peak !== null && (worst === null || peak > (peakOf(worst) ?? -1)) ? r : worst;
  }, null);
}

function rankName(rank: IReport, i: number): string {
  return `rank ${rank.rank ?? i}`;
}

function peakAt(device: IReportDevice | null): string {
  if (!device?.peak_phase) {
    return '–';
  }
  return device.peak_step === null
    ? device.peak_phase
    : `${device.peak_phase}, step ${device.peak_step}`;
}

const WORST_ROW: React.CSSProperties = {
  fontWeight: 600,
  background: 'var(--jp-layout-color2)',
  boxShadow: 'inset 3px 0 0 var(--jp-error-color1)'
};

/** One row per rank; clicking a row selects it for the details. */
export function RankTable(props: {
  ranks: IReport[];
  worst: IReport | null;
  selected: number;
  units: Units;
  onSelect: (index: number) => void;
}): JSX.Element {
  const { ranks, worst, selected, units, onSelect } = props;
  const top = Math.max(1, ...ranks.map(r => peakOf(r) ?? 0));
  return (
    <table className="jp-GpuMem-table jp-GpuMem-rankTable">
      <thead>
        <tr>
          <th>Rank</th>
          <th className="jp-GpuMem-num">PID</th>
          <th>Device</th>
          <th style={{ width: '35%' }}>Peak allocated</th>
          <th className="jp-GpuMem-num">Peak reserved</th>
          <th>Peak at</th>
        </tr>
      </thead>
      <tbody>
        {ranks.map((rank, i) => {
          const device = rankDevice(rank);
          const peak = peakOf(rank);
          const isWorst = rank === worst;
          const failed = rank.status !== 'ok';
          return (
            <tr
              key={`${rank.rank ?? i}:${rank.pid ?? i}`}
              className={`jp-GpuMem-rankRow${isWorst ? ' jp-mod-worst' : ''}`}
              aria-selected={i === selected}
              style={{ cursor: 'pointer', ...(isWorst ? WORST_ROW : {}) }}
              onClick={() => onSelect(i)}
            >
              <td style={{ whiteSpace: 'nowrap' }}>
                {rankName(rank, i)}
                {isWorst && (
                  <>
                    {' '}
                    <span className="jp-GpuMem-status jp-mod-bad jp-GpuMem-worstMark">worst</span>
                  </>
                )}
              </td>
              <td className="jp-GpuMem-num">{rank.pid ?? '–'}</td>
              <td>{device?.device ?? '–'}</td>
              {peak === null ? (
                <td colSpan={3} className="jp-GpuMem-rankError">
                  {rank.error ?? rank.status}
                </td>
              ) : (
                <>
                  <td>
                    <div
                      className="jp-GpuMem-gauge"
                      role="meter"
                      aria-label={`peak allocated of ${rankName(rank, i)}`}
                      aria-valuemin={0}
                      aria-valuemax={top}
                      aria-valuenow={peak}
                    >
                      <div className="jp-GpuMem-gaugeTrack">
                        <div
                          className={`jp-GpuMem-gaugeFill jp-mod-${isWorst ? 'high' : 'ok'}`}
                          style={{ width: `${((peak / top) * 100).toFixed(1)}%` }}
                        />
                      </div>
                      <div className="jp-GpuMem-gaugeText">
                        {formatBytes(peak, units)}
                        {failed && rank.error ? ` · ${rank.error}` : ''}
                      </div>
                    </div>
                  </td>
                  <CacheCell device={device} bytes={device?.peak_reserved_bytes} units={units} />
                  <td>{peakAt(device)}</td>
                </>
              )}
            </tr>
          );
        })}
      </tbody>
    </table>
  );
}

/** The ranks' table and the selected rank's report; the worst rank is selected first. */
export function RankSection(props: {
  report: IReport;
  units: Units;
  /** Draws one rank's own report (the renderer's report view). */
  renderRank: (rank: IReport) => JSX.Element;
}): JSX.Element | null {
  const ranks = props.report.ranks ?? [];
  const worst = worstRank(props.report);
  const [chosen, setChosen] = React.useState<number | null>(null);
  if (!ranks.length) {
    return null;
  }
  const first = worst ? ranks.indexOf(worst) : 0;
  const selected = Math.min(chosen ?? first, ranks.length - 1);
  const worstText = worst
    ? `; the worst is ${rankName(worst, first)}, peak ${formatBytes(peakOf(worst), props.units)}`
    : '';
  return (
    <div className="jp-GpuMem-ranks">
      <div className="jp-GpuMem-sectionTitle">
        {ranks.length} worker process{ranks.length === 1 ? '' : 'es'}
        {worstText}
      </div>
      <RankTable
        ranks={ranks}
        worst={worst}
        selected={selected}
        units={props.units}
        onSelect={setChosen}
      />
      <label className="jp-GpuMem-rankPicker">
        Details for{' '}
        <select
          className="jp-GpuMem-rankSelect"
          value={selected}
          onChange={event => setChosen(Number(event.currentTarget.value))}
        >
          {ranks.map((rank, i) => (
            <option key={i} value={i}>
              {rankName(rank, i)}
              {rank.pid !== null && rank.pid !== undefined ? ` · pid ${rank.pid}` : ''}
              {rank === worst ? ' · worst' : ''}
            </option>
          ))}
        </select>
      </label>
      <div className="jp-GpuMem-rankDetails">{props.renderRank(ranks[selected])}</div>
    </div>
  );
}
