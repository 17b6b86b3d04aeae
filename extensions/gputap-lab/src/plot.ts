/** The GPU history as a small SVG: utilisation and memory use, 0–100 %, oldest left. */
import { IHistoryPoint } from './model';

const SVG = 'http://www.w3.org/2000/svg';
const WIDTH = 240;
const HEIGHT = 56;

/** The `points` attribute of a polyline for `values` (0–100, null for gaps dropped). */
export function polylinePoints(
  values: (number | null)[],
  slots: number
): string {
  const step = slots > 1 ? WIDTH / (slots - 1) : 0;
  const offset = slots - values.length;
  return values
    .map((value, i) =>
      value === null
        ? null
        : `${((offset + i) * step).toFixed(1)},${(
            HEIGHT -
            (Math.min(100, Math.max(0, value)) / 100) * HEIGHT
          ).toFixed(1)}`
    )
    .filter(point => point !== null)
    .join(' ');
}

/** The plot for `history`, drawn over `slots` samples (the history's full length). */
export function historyPlot(history: IHistoryPoint[], slots: number): SVGSVGElement {
  const svg = document.createElementNS(SVG, 'svg');
  svg.setAttribute('viewBox', `0 0 ${WIDTH} ${HEIGHT}`);
  svg.setAttribute('preserveAspectRatio', 'none');
  svg.setAttribute('class', 'gputap-plot');
  svg.dataset.testid = 'gputap-gpu-plot';
  svg.setAttribute('role', 'img');
  const title = document.createElementNS(SVG, 'title');
  title.textContent = 'GPU use over the last minutes';
  svg.appendChild(title);
  const lines: [string, (number | null)[]][] = [
    [
      'gputap-plot-memory',
      history.map(p =>
        p.memory_total_bytes && p.memory_used_bytes !== null
          ? (100 * p.memory_used_bytes) / p.memory_total_bytes
          : null
      )
    ],
    ['gputap-plot-utilization', history.map(p => p.utilization_percent)]
  ];
  for (const [cls, values] of lines) {
    if (values.every(v => v === null)) {
      continue;
    }
    const line = document.createElementNS(SVG, 'polyline');
    line.setAttribute('class', cls);
    line.setAttribute('points', polylinePoints(values, Math.max(slots, values.length)));
    svg.appendChild(line);
  }
  return svg;
}
