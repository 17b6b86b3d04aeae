/**
 * Pure formatting and arithmetic of what the panel shows. Money is integers of
 * micro-credits until the moment it is printed.
 */

const MICRO = 1_000_000;

/**
 * Exact credits, never rounded: two decimals at least, six at most, exactly as billing
 * writes them (gputap_common.money.format_credits): 10_000_000 → "10.00",
 * 9_998_733 → "9.998733", 1_142_857 → "1.142857", -5_000 → "-0.005".
 */
export function formatCredits(micro: number): string {
  const sign = micro < 0 ? '-' : '';
  const abs = Math.abs(Math.trunc(micro));
  let fraction = String(abs % MICRO).padStart(6, '0');
  while (fraction.length > 2 && fraction.endsWith('0')) {
    fraction = fraction.slice(0, -1);
  }
  return `${sign}${Math.floor(abs / MICRO)}.${fraction}`;
}

/** What `seconds` at `pricePerHourMicro` cost, as billing counts it (whole micro-credits). */
export function costMicro(seconds: number, pricePerHourMicro: number): number {
  return Math.floor((Math.max(0, Math.floor(seconds)) * pricePerHourMicro) / 3600);
}

/** "512 MiB", "9.8 GiB". */
export function formatBytes(bytes: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  const digits = value >= 100 || unit === 0 ? 0 : 1;
  return `${value.toFixed(digits)} ${units[unit]}`;
}

/** "45 s", "14 min", "3 h 20 min", "2 d 4 h". */
export function formatDuration(seconds: number): string {
  const s = Math.max(0, Math.floor(seconds));
  if (s < 60) {
    return `${s} s`;
  }
  const minutes = Math.floor(s / 60);
  if (minutes < 60) {
    return `${minutes} min`;
  }
  const hours = Math.floor(minutes / 60);
  if (hours < 48) {
    return `${hours} h ${minutes % 60} min`;
  }
  return `${Math.floor(hours / 24)} d ${hours % 24} h`;
}

/** "2026-11-30 14:05" in the browser's time zone. */
export function formatDate(iso: string | null | undefined): string {
  if (!iso) {
    return '';
  }
  const date = new Date(iso);
  if (isNaN(date.getTime())) {
    return iso;
  }
  const pad = (n: number) => String(n).padStart(2, '0');
  return (
    `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())} ` +
    `${pad(date.getHours())}:${pad(date.getMinutes())}`
  );
}

/** "12.5" hours left → "12.5 h". */
export function formatHours(hours: number): string {
  return `${Math.round(hours * 10) / 10} h`;
}
