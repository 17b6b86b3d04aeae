/**
 * The panel's Scale out section: workers beside this server (docs/scale-out.md). The price
 * of the group and how long the credit lasts with it before starting, Start and Stop, each
 * worker's state and GPU use, and what the group cost so far, ticking.
 */
import { fill, h } from './dom';
import { costMicro, formatBytes, formatCredits, formatDuration } from './format';
import { GPUTapModel, IDevice } from './model';
import { requestAPI, sendJSON } from './request';

/** One worker, as the hub's `GET {server}/workers` shows it. */
export interface IWorker {
  name: string;
  state: 'placing' | 'waiting' | 'starting' | 'ready' | 'failed' | 'stopping' | 'stopped';
  reason: string;
  offering: string | null;
  label: string;
  count: number | null;
  /** per GPU (or slice, or share): the worker's rate is this × count */
  price_per_hour_micro: number | null;
  started_at: string | null;
  ended_at: string | null;
  busy: boolean;
  gpus: IDevice[] | null;
  /** what stands instead of numbers (a simulated card, NVML missing) */
  gpu_note: string;
}

/** The server's group of workers. */
export interface IWorkerGroup {
  server: string;
  workers: IWorker[];
  count: number;
  offering: string | null;
  rate_per_hour_micro: number;
  price_per_hour: string;
  idle_seconds: number;
}

/** States in which a worker is part of the group: the section follows it closely then. */
const ACTIVE = new Set(['placing', 'waiting', 'starting', 'ready', 'stopping']);
/** How often the group is read while it has workers, and while it has none. */
const BUSY_POLL_MS = 2000;
const IDLE_POLL_MS = 10000;

/** What `worker` cost from its start to its end (or now), in micro-credits. */
export function workerCostMicro(worker: IWorker, now: number): number {
  if (!worker.started_at || worker.price_per_hour_micro === null) {
    return 0;
  }
  const end = worker.ended_at ? Date.parse(worker.ended_at) : now;
  const seconds = (end - Date.parse(worker.started_at)) / 1000;
  return costMicro(seconds, worker.price_per_hour_micro * (worker.count ?? 1));
}

export class ScaleOutSection {
  readonly node = h('section', { class: 'gputap-section', 'data-testid': 'gputap-scale' });
  private _count = h('input', {
    class: 'jp-mod-styled gputap-input gputap-size',
    id: 'gputap-scale-count',
    'data-testid': 'gputap-scale-count',
    type: 'number',
    min: 1,
    step: 1,
    value: 2,
    'aria-label': 'Workers'
  });
  private _gpus = h('input', {
    class: 'jp-mod-styled gputap-input gputap-size',
    id: 'gputap-scale-gpus',
    'data-testid': 'gputap-scale-gpus',
    type: 'number',
    min: 1,
    step: 1,
    value: 1,
    'aria-label': 'GPUs per worker'
  });
  private _each = h('span', { class: 'gputap-muted', 'data-testid': 'gputap-scale-each' });
  private _price = h('div', { class: 'gputap-row', 'data-testid': 'gputap-scale-price' });
  private _lasts = h('div', { class: 'gputap-row', 'data-testid': 'gputap-scale-lasts' });
  private _start = h(
    'button',
    {
      class: 'jp-mod-styled jp-mod-accept gputap-button',
      id: 'gputap-scale-start',
      'data-testid': 'gputap-scale-start'
    },
    'Start workers'
  );
  private _stop = h(
    'button',
    {
      class: 'jp-mod-styled jp-mod-warn gputap-button',
      id: 'gputap-scale-stop',
      'data-testid': 'gputap-scale-stop'
    },
    'Stop workers'
  );
  private _error = h('p', {
    class: 'gputap-message gputap-error',
    'data-testid': 'gputap-scale-error',
    'aria-live': 'polite'
  });
  private _group = h('div', { 'data-testid': 'gputap-scale-group' });
  private _list = h('div', { class: 'gputap-worker-list', 'data-testid': 'gputap-worker-list' });

  private _view: IWorkerGroup | null = null;
  private _readAt = 0;
  private _reading = false;
  private _asking = false;
  /** the server the GPUs input was set for: a change of GPU resets it to the new count */
  private _defaultsFor = '';

  constructor(private _model: GPUTapModel) {
    this._count.addEventListener('input', () => this.update());
    this._gpus.addEventListener('input', () => this.update());
    this._start.addEventListener('click', () => void this._scale());
    this._stop.addEventListener('click', () => void this._stopAll());
    fill(
      this.node,
      h('h3', {}, 'Scale out'),
      h(
        'p',
        { class: 'gputap-muted' },
        'Workers beside this server for gputap.run (torchrun); the notebook stays rank 0.'
      ),
      h(
        'div',
        { class: 'gputap-scale-form' },
        h('label', {}, this._count, ' workers × '),
        h('label', {}, this._gpus, ' '),
        this._each
      ),
      this._price,
      this._lasts,
      h('div', { class: 'gputap-actions' }, this._start, this._stop),
      this._error,
      this._group,
      this._list
    );
  }

  /** Called every second (the cost ticks) and on every model change. */
  update(): void {
    const model = this._model;
    const server = model.server;
    const kind = this._kind();
    if (server?.offering && this._defaultsFor !== server.offering) {
      this._defaultsFor = server.offering;
      this._gpus.value = String(kind === 'card' ? server.count || 1 : 1);
    }
    // a worker of a slice, a share or a CPU server is one of it: only cards take a number
    this._gpus.disabled = kind !== 'card';
    fill(this._each, this._eachText(kind));
    const live = this._liveWorkers();
    const running = !!server?.running && model.stoppedAt === null && !model.restarting;
    this._start.disabled = !running || this._asking;
    this._start.textContent = live.length ? 'Resize group' : 'Start workers';
    this._stop.disabled = !running || this._asking || !live.length;
    this._showPrice();
    this._showGroup();
  }

  /**
   * Read the group now and then while the panel is `shown`: every 2 s while it has
   * workers, every 10 s otherwise (a cell's gputap.run may start some).
   */
  poll(shown: boolean): void {
    const model = this._model;
    if (!shown || this._reading || model.stoppedAt !== null || model.restarting) {
      return;
    }
    if (!model.server?.running) {
      return;
    }
    const wait = this._liveWorkers().length ? BUSY_POLL_MS : IDLE_POLL_MS;
    if (Date.now() - this._readAt >= wait) {
      void this._read();
    }
  }

  private async _read(): Promise<void> {
    this._reading = true;
    try {
      this._view = await requestAPI<IWorkerGroup>('workers');
    } catch {
      // the next poll tries again; the group stays as last read
    } finally {
      this._reading = false;
      this._readAt = Date.now();
    }
    this.update();
  }

  /** The server's kind of offering: card, slice, shared or cpu. */
  private _kind(): string {
    const choice = this._model.currentChoice();
    if (choice) {
      return choice.kind;
    }
    const offering = this._model.server?.offering ?? '';
    return offering === 'cpu' ? 'cpu' : offering.includes('/') ? 'slice' : 'card';
  }

  private _eachText(kind: string): string {
    const server = this._model.server;
    // the choice's label names one unit; the server's may count its GPUs
    const label = this._model.currentChoice()?.label || server?.label || server?.offering || '';
    return kind === 'card' ? `${label} GPUs each` : `(one ${label} each)`;
  }

  private _liveWorkers(): IWorker[] {
    return (this._view?.workers ?? []).filter(w => ACTIVE.has(w.state));
  }

  /** The whole number typed in `input`, or null. */
  private _number(input: HTMLInputElement): number | null {
    const value = Number(input.value);
    return Number.isInteger(value) && value >= 1 ? value : null;
  }

  /** What one unit (GPU, slice, share) of the server's offering costs per hour. */
  private _unitPrice(): number | null {
    const { server } = this._model;
    if (server?.session) {
      return server.session.price_per_hour_micro;
    }
    const choice = this._model.currentChoice();
    return choice ? choice.price_per_hour_micro : null;
  }

  /** The inputs' group price, and how long what pays lasts with the group running. */
  private _showPrice(): void {
    const model = this._model;
    const currency = model.currency;
    const count = this._number(this._count);
    const gpus = this._gpus.disabled ? 1 : this._number(this._gpus);
    const unit = this._unitPrice();
    if (count === null || gpus === null) {
      fill(
        this._price,
        h('span', { class: 'gputap-error' }, 'Workers and GPUs are whole numbers, 1 or more.')
      );
      fill(this._lasts);
      return;
    }
    if (unit === null) {
      fill(this._price, h('span', { class: 'gputap-muted' }, '…'));
      fill(this._lasts);
      return;
    }
    const proposed = count * gpus * unit;
    fill(
      this._price,
      h('span', { class: 'gputap-label' }, `price of ${count} worker${count === 1 ? '' : 's'}`),
      h('span', { class: 'gputap-value' }, `${formatCredits(proposed)} ${currency}/h`)
    );
    // running workers are paid at the view's rate; before, at the inputs' price
    const live = this._liveWorkers().length > 0;
    const group = live ? this._view?.rate_per_hour_micro ?? 0 : proposed;
    const pays = this._paying();
    if (!pays || model.stoppedAt !== null) {
      fill(this._lasts);
      return;
    }
    const rate = pays.rate + group;
    fill(
      this._lasts,
      h('span', { class: 'gputap-label' }, pays.course ? 'course hours last' : 'credit lasts'),
      h(
        'span',
        { class: 'gputap-value' },
        rate > 0
          ? `${formatDuration((Math.max(0, pays.available) * 3600) / rate)} ` +
              `at ${formatCredits(rate)}/h` +
              (live ? '' : ' with these workers')
          : '—'
      )
    );
  }

  /**
   * What pays for this server and its workers (the course's hours or the own credit): what
   * is available now, and its rate without this server's workers (the server and whatever
   * else runs on it), so the section adds the group it shows.
   */
  private _paying(): { course: string; available: number; rate: number } | null {
    const model = this._model;
    const server = model.server;
    const account = server?.account;
    if (!server || !account) {
      return null;
    }
    const course = server.session?.course || server.course || '';
    const available = course ? model.courseAvailableMicro(course) : model.creditAvailableMicro();
    if (available === null) {
      return null;
    }
    const total = course
      ? account.courses?.find(c => c.course === course)?.rate_per_hour_micro ?? 0
      : account.credit?.rate_per_hour_micro ?? account.rate_per_hour_micro;
    const workers = (account.running ?? []).filter(
      s => s.worker && s.server_name === server.server && (s.course || '') === course
    );
    const theirs = workers.reduce((sum, s) => sum + s.price_per_hour_micro * s.count, 0);
    return { course, available, rate: Math.max(0, total - theirs) };
  }

  /** The group's rate and cost so far, and each worker. */
  private _showGroup(): void {
    const view = this._view;
    const workers = view?.workers ?? [];
    if (!view || !workers.length) {
      fill(this._group);
      fill(this._list, h('p', { class: 'gputap-muted' }, view ? 'No workers.' : ''));
      return;
    }
    const currency = this._model.currency;
    const now = this._model.stoppedAt ?? Date.now();
    const cost = workers.reduce((sum, w) => sum + workerCostMicro(w, now), 0);
    fill(
      this._group,
      h(
        'div',
        { class: 'gputap-row', 'data-testid': 'gputap-scale-rate' },
        h('span', { class: 'gputap-label' }, 'group rate'),
        h(
          'span',
          { class: 'gputap-value' },
          `${formatCredits(view.rate_per_hour_micro)} ${currency}/h`
        )
      ),
      h(
        'div',
        { class: 'gputap-row', 'data-testid': 'gputap-scale-cost' },
        h('span', { class: 'gputap-label' }, 'this group so far'),
        h('span', { class: 'gputap-value' }, `${formatCredits(cost)} ${currency}`)
      )
    );
    fill(this._list, ...workers.map(w => workerRow(w)));
  }

  private async _scale(): Promise<void> {
    const count = this._number(this._count);
    const gpus = this._gpus.disabled ? null : this._number(this._gpus);
    if (count === null || (!this._gpus.disabled && gpus === null)) {
      fill(this._error, 'Workers and GPUs are whole numbers, 1 or more.');
      return;
    }
    await this._ask(() =>
      sendJSON<IWorkerGroup>('workers', gpus === null ? { count } : { count, gpus })
    );
  }

  private async _stopAll(): Promise<void> {
    await this._ask(() => requestAPI<IWorkerGroup | undefined>('workers', { method: 'DELETE' }));
  }

  /** Send a request; show the hub's refusal (400, 402, 403, 409) here; read the group. */
  private async _ask(send: () => Promise<IWorkerGroup | undefined>): Promise<void> {
    this._asking = true;
    fill(this._error);
    this.update();
    try {
      const view = await send();
      if (view && Array.isArray(view.workers)) {
        this._view = view;
      }
    } catch (error) {
      fill(this._error, (error as Error).message);
    } finally {
      this._asking = false;
    }
    await this._read();
  }
}

/** One worker: name, state and why, its GPUs, their use (or why there are no numbers). */
function workerRow(worker: IWorker): HTMLElement {
  const use: HTMLElement[] = [];
  if (worker.gpu_note) {
    use.push(
      h('div', { class: 'gputap-muted', 'data-testid': 'gputap-worker-gpu-note' }, worker.gpu_note)
    );
  }
  for (const device of worker.gpus ?? []) {
    const memory =
      device.memory_used_bytes !== null && device.memory_total_bytes !== null
        ? `${formatBytes(device.memory_used_bytes)} / ${formatBytes(device.memory_total_bytes)}`
        : 'memory ?';
    const utilization =
      device.utilization_percent !== null ? `${device.utilization_percent} % · ` : '';
    use.push(
      h(
        'div',
        { class: 'gputap-row', 'data-testid': 'gputap-worker-gpu' },
        h('span', {}, device.name ?? device.uuid),
        h('span', {}, `${utilization}${memory}`)
      )
    );
  }
  return h(
    'div',
    {
      class: 'gputap-disk gputap-worker',
      'data-testid': `gputap-worker-${worker.name}`,
      'data-state': worker.state
    },
    h(
      'div',
      { class: 'gputap-row' },
      h('span', { class: 'gputap-disk-name' }, worker.name),
      h(
        'span',
        { 'data-testid': 'gputap-worker-state' },
        worker.state + (worker.busy ? ' · busy' : '')
      )
    ),
    h('div', { class: 'gputap-muted' }, worker.label || worker.offering || ''),
    worker.reason
      ? h('div', { class: 'gputap-muted', 'data-testid': 'gputap-worker-reason' }, worker.reason)
      : null,
    ...use
  );
}
