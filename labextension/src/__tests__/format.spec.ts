import {
  formatBytes,
  formatPercent,
  formatSeconds,
  formatUsedTotal,
  UNKNOWN
} from '../format';

describe('formatBytes', () => {
  it('uses binary prefixes for GiB', () => {
    expect(formatBytes(0)).toBe('0 B');
    expect(formatBytes(1023)).toBe('1023 B');
    expect(formatBytes(1536)).toBe('1.5 KiB');
    expect(formatBytes(1610612736)).toBe('1.5 GiB');
    expect(formatBytes(85520809984)).toBe('79.6 GiB');
  });

  it('uses decimal prefixes for GB', () => {
    expect(formatBytes(1500, 'GB')).toBe('1.5 kB');
    expect(formatBytes(85520809984, 'GB')).toBe('85.5 GB');
  });

  it('shows unknown values as a dash, never as zero', () => {
    expect(formatBytes(null)).toBe(UNKNOWN);
    expect(formatBytes(undefined)).toBe(UNKNOWN);
    expect(formatBytes(NaN)).toBe(UNKNOWN);
  });
});

describe('formatUsedTotal', () => {
  it('puts both sides in the unit of the total', () => {
    expect(formatUsedTotal(13207024435, 85899345920)).toBe('12.3/80 GiB');
    expect(formatUsedTotal(null, 85899345920)).toBe(`${UNKNOWN}/80 GiB`);
  });
});

describe('formatSeconds', () => {
  it('picks ms, s, min', () => {
    expect(formatSeconds(0.0004)).toBe('0.4 ms');
    expect(formatSeconds(0.187)).toBe('187 ms');
    expect(formatSeconds(3.4178)).toBe('3.42 s');
    expect(formatSeconds(125)).toBe('2 min 5 s');
    expect(formatSeconds(300)).toBe('5 min');
    expect(formatSeconds(7380)).toBe('2 h 3 min');
    expect(formatSeconds(null)).toBe(UNKNOWN);
  });
});

describe('formatPercent', () => {
  it('rounds', () => {
    expect(formatPercent(87.4)).toBe('87%');
    expect(formatPercent(null)).toBe(UNKNOWN);
  });
});
