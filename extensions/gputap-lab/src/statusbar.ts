/** The status-bar item: "A100-80GB 1g.10gb · 37% · 0.42 credits"; a click opens the panel. */
import { Widget } from '@lumino/widgets';

import { formatBytes, formatCredits } from './format';
import { GPUTapModel } from './model';

/** The item's text for the model as it is now. */
export function statusText(model: GPUTapModel): string {
  const server = model.server;
  const parts: string[] = [];
  parts.push(server ? server.label || server.offering || 'gputap' : 'gputap');
  const gpu = model.gpu;
  if (gpu?.simulated) {
    parts.push('simulated');
  } else if (gpu?.available && gpu.devices.length) {
    const utilizations = gpu.devices
      .map(d => d.utilization_percent)
      .filter((u): u is number => u !== null);
    if (utilizations.length) {
      parts.push(
        `${Math.round(utilizations.reduce((a, b) => a + b, 0) / utilizations.length)}%`
      );
    } else {
      const used = gpu.devices.reduce((a, d) => a + d.memory_used_bytes, 0);
      parts.push(`${formatBytes(used)} used`);
    }
  }
  const cost = model.costSoFarMicro();
  if (cost !== null) {
    parts.push(`${formatCredits(cost)} ${model.currency}`);
  }
  return parts.join(' · ');
}

export class GPUTapStatus extends Widget {
  private _ticker: number;

  constructor(
    private _model: GPUTapModel,
    onClick: () => void
  ) {
    super();
    this.id = 'gputap-status';
    this.addClass('gputap-status');
    this.addClass('jp-StatusBar-TextItem');
    this.node.dataset.testid = 'gputap-status';
    this.node.title = 'gputap: GPU use and cost of this server (click for more)';
    this.node.addEventListener('click', onClick);
    _model.changed.connect(this._update, this);
    this._ticker = window.setInterval(() => this._update(), 1000);
    this._update();
  }

  dispose(): void {
    window.clearInterval(this._ticker);
    this._model.changed.disconnect(this._update, this);
    super.dispose();
  }

  private _update(): void {
    this.node.textContent = statusText(this._model);
  }
}
