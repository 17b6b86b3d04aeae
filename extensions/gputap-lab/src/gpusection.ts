/** The panel's GPU section: the card or slice, live use, the history plot. */
import { fill, h } from './dom';
import { formatBytes } from './format';
import { GPUTapModel, IDevice } from './model';
import { historyPlot } from './plot';

export class GPUSection {
  readonly node = h('section', { class: 'gputap-section', 'data-testid': 'gputap-gpu' });
  private _card = h('div', { class: 'gputap-card', 'data-testid': 'gputap-card' });
  private _environment = h('div', {
    class: 'gputap-environment',
    'data-testid': 'gputap-environment'
  });
  private _ready = h('div', { class: 'gputap-muted', 'data-testid': 'gputap-time-to-ready' });
  private _body = h('div', { class: 'gputap-gpu-body' });

  constructor(private _model: GPUTapModel) {
    fill(
      this.node,
      h('h3', {}, 'GPU'),
      this._card,
      this._environment,
      this._ready,
      this._body
    );
  }

  update(): void {
    const { server, gpu, gpuError } = this._model;
    const environment = server?.environment;
    this._environment.hidden = !environment;
    if (environment) {
      fill(
        this._environment,
        'Environment: ',
        h('b', { title: environment.description }, environment.name),
        ...environment.tags.map(tag => h('span', { class: 'gputap-tag' }, tag))
      );
    }
    const ready = server?.time_to_ready;
    this._ready.hidden = !ready;
    this._ready.textContent = ready ? ready.message : '';
    const label = server?.label || server?.offering || '';
    fill(
      this._card,
      label || (this._model.serverError ? '' : '…'),
      server?.simulated
        ? h('span', { class: 'gputap-tag', 'data-testid': 'gputap-simulated-tag' }, 'simulated')
        : null
    );
    if (gpuError && !gpu) {
      fill(this._body, h('p', { class: 'gputap-error' }, gpuError));
      return;
    }
    if (!gpu) {
      fill(this._body, h('p', { class: 'gputap-muted' }, 'Reading the GPU…'));
      return;
    }
    if (gpu.simulated) {
      fill(
        this._body,
        h(
          'p',
          { class: 'gputap-muted', 'data-testid': 'gputap-gpu-simulated' },
          'simulated card: no live numbers'
        )
      );
      return;
    }
    if (!gpu.available) {
      fill(
        this._body,
        h(
          'p',
          { class: 'gputap-muted', 'data-testid': 'gputap-gpu-unavailable' },
          gpu.message || 'No live GPU numbers.'
        )
      );
      return;
    }
    const slots = Math.max(
      1,
      Math.ceil((gpu.history_seconds || 300) / (gpu.interval_seconds || 3))
    );
    fill(
      this._body,
      ...gpu.devices.map(device => this._device(device)),
      historyPlot(gpu.history, slots),
      h(
        'div',
        { class: 'gputap-legend' },
        gpu.devices.some(d => d.utilization_percent !== null)
          ? h('span', { class: 'gputap-legend-utilization' }, 'utilisation')
          : null,
        h('span', { class: 'gputap-legend-memory' }, 'memory'),
        h('span', { class: 'gputap-muted' }, gpu.busy ? ' · busy' : ' · idle')
      )
    );
  }

  private _device(device: IDevice): HTMLElement {
    const used = device.memory_used_bytes;
    const total = device.memory_total_bytes;
    const known = used !== null && total !== null;
    const memory = known ? `${formatBytes(used)} / ${formatBytes(total)}` : '?';
    const memoryPercent = known && total > 0 ? Math.round((100 * used) / total) : 0;
    const rows: HTMLElement[] = [];
    if (device.utilization_percent !== null) {
      rows.push(
        meter(
          'utilisation',
          `${device.utilization_percent} %`,
          device.utilization_percent,
          'gputap-gpu-utilization'
        )
      );
    }
    rows.push(meter('memory', memory, memoryPercent, 'gputap-gpu-memory'));
    if (device.kind === 'mig' && device.activity_source !== 'gpm') {
      rows.push(
        h(
          'div',
          { class: 'gputap-row', 'data-testid': 'gputap-gpu-processes' },
          h('span', {}, 'processes'),
          h('span', {}, String(device.compute_processes ?? '?'))
        ),
        h(
          'p',
          { class: 'gputap-muted' },
          'This slice has no utilisation of its own (NVML gives none on this GPU): it counts as busy while what it holds (processes, memory) keeps changing.'
        )
      );
    }
    if (device.error) {
      rows.push(
        h('p', { class: 'gputap-error', 'data-testid': 'gputap-gpu-error' }, device.error)
      );
    }
    return h(
      'div',
      { class: 'gputap-device', 'data-testid': `gputap-device-${device.kind}` },
      h('div', { class: 'gputap-device-name' }, device.name ?? device.uuid),
      ...rows
    );
  }
}

function meter(label: string, text: string, percent: number, testid: string): HTMLElement {
  const bar = h('div', { class: 'gputap-bar-fill' });
  bar.style.width = `${Math.min(100, Math.max(0, percent))}%`;
  return h(
    'div',
    { class: 'gputap-meter', 'data-testid': testid },
    h('div', { class: 'gputap-row' }, h('span', {}, label), h('span', {}, text)),
    h('div', { class: 'gputap-bar' }, bar)
  );
}
