/** The status-bar item: "A100-80GB 1g.10gb · 37% · 0.42 credits"; a click opens the panel. */
import { formatBytes, formatCredits } from './format';
import { GPUTapModel } from './model';
import { ModelView } from './view';

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
      const used = gpu.devices.reduce((a, d) => a + (d.memory_used_bytes ?? 0), 0);
      parts.push(`${formatBytes(used)} used`);
    }
  }
  const cost = model.costSoFarMicro();
  if (cost !== null) {
    parts.push(`${formatCredits(cost)} ${model.currency}`);
  }
  return parts.join(' · ');
}

export class GPUTapStatus extends ModelView {
  constructor(model: GPUTapModel, onClick: () => void) {
    super(model, 'gputap-status');
    this.addClass('jp-StatusBar-TextItem');
    this.node.title = 'gputap: GPU use and cost of this server (click for more)';
    this.node.addEventListener('click', onClick);
    this.render();
  }

  protected render(): void {
    this.node.textContent = statusText(this.model);
  }
}
