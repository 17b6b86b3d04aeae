/**
 * What the panel and the status bar show, fetched from the server extension:
 * `gputap/gpu` every few seconds, `gputap/server` (session, account) every ~10 s,
 * choices and disks when asked. Views listen to `changed` and tick the cost themselves.
 */
import { ISignal, Signal } from '@lumino/signaling';

import { costMicro } from './format';
import { RequestError, requestAPI } from './request';

export interface IDevice {
  uuid: string;
  name: string | null;
  kind: 'gpu' | 'mig';
  memory_used_bytes: number | null;
  memory_total_bytes: number | null;
  utilization_percent: number | null;
  compute_processes: number | null;
  /** what decides whether it is busy: its utilisation, its GPM activity, or its memory */
  activity_source: 'utilization' | 'gpm' | 'memory' | null;
  /** what NVML could not give, and why */
  error: string | null;
}

export interface IHistoryPoint {
  at: string;
  utilization_percent: number | null;
  memory_used_bytes: number | null;
  memory_total_bytes: number | null;
  compute_processes: number | null;
  busy: boolean;
}

export interface IGPUState {
  simulated: boolean;
  available: boolean;
  busy: boolean;
  message: string | null;
  sampled_at: string | null;
  interval_seconds: number;
  history_seconds: number;
  devices: IDevice[];
  history: IHistoryPoint[];
}

export interface ISession {
  id: string;
  sku: string;
  count: number;
  price_per_hour_micro: number;
  started_at: string;
  billed_seconds?: number;
  cost_micro?: number;
  course?: string | null;
  /** the server's name ("" the default one) and, for a scale-out worker's session, "w1" */
  server_name?: string;
  worker?: string;
}

export interface IWarning {
  threshold_seconds: number;
  seconds_left: number;
  course: string | null;
  message: string;
}

/** The user's own credit (trial + paid), apart from course hours: billing's `credit`. */
export interface ICredit {
  trial_micro: number;
  paid_micro: number;
  balance_micro: number;
  available_micro: number;
  free_micro: number;
  rate_per_hour_micro: number;
  seconds_left: number | null;
}

/** One course's allowance left for this student (billing's `courses`). */
export interface ICourseMoney {
  course: string;
  available_micro: number;
  rate_per_hour_micro: number;
  seconds_left: number | null;
}

export interface IAccount {
  currency: string;
  available_micro: number;
  available: string;
  rate_per_hour_micro: number;
  seconds_left: number | null;
  warnings: IWarning[];
  credit?: ICredit;
  courses?: ICourseMoney[];
  running?: ISession[];
  storage?: ISession[];
  as_of?: string;
}

export interface IChangeStatus {
  state: 'stopping' | 'starting' | 'waiting' | 'done' | 'failed' | 'reverted';
  from: string;
  to: string;
  /** why the server restarts: "change", a disk's restart, or "fault" (a GPU fault's recovery) */
  reason?: string;
  message: string;
  started_at: string;
  finished_at: string | null;
}

/** Why the server stops, as the hub announced it (docs/lab.md, "Why a server stopped"). */
export interface IStopNotice {
  kind: string;
  message: string;
  todo: string;
  at: string;
  notice: string;
  /** kind "fault": whether the hub starts the server again by itself (absent: false) */
  restarting?: boolean;
}

/** How long a start took, from the hub's start of the server to its first answer. */
export interface ITimeToReady {
  seconds: number;
  /** of which waiting in the queue for a GPU */
  queued_seconds: number;
  /** the sentence the spawn page and the hub's home page show too */
  message: string;
}

/** The environment the server runs (the spawn form's choice). */
export interface IEnvironment {
  key: string;
  name: string;
  description: string;
  tags: string[];
}

export interface IServer {
  user: string;
  server: string;
  running: boolean;
  pending: string | null;
  offering: string;
  label: string;
  count: number;
  simulated: boolean;
  /** how long this server's start took (absent until it answered) */
  time_to_ready?: ITimeToReady | null;
  course: string;
  environment?: IEnvironment | null;
  disks: { name: string; path: string }[];
  session: ISession | null;
  account: IAccount | null;
  change: IChangeStatus | null;
  stop?: IStopNotice | null;
}

export interface IChoice {
  key: string;
  label: string;
  kind: string;
  free: number;
  total: number;
  max_count: number;
  price_per_hour_micro: number;
  price_per_hour: string;
  course: { slug: string; name: string } | null;
  hours_left: number | null;
  options: Record<string, unknown>;
  /** whether what would pay for it (the course's hours or the credit) can start it */
  affordable?: boolean;
  /** why not, as a sentence part ("needs 0.13 credits for the first 5 s; you have 0.05") */
  shortfall?: string | null;
}

export interface IChoices {
  current: string;
  choices: IChoice[];
  currency: string;
  simulated: boolean;
}

export interface IDisk {
  name: string;
  size_gb: number;
  created_at: string;
  attached_to: string | null;
  attached_running: boolean;
  used_bytes: number | null;
}

export interface IDisks {
  disks: IDisk[];
  limits: { max_disks: number; max_size_gb: number };
  price_per_gb_hour_micro: number;
  currency?: string;
}

/** Fetches and holds what the views show. */
export class GPUTapModel {
  gpu: IGPUState | null = null;
  gpuError: string | null = null;
  server: IServer | null = null;
  serverError: string | null = null;
  choices: IChoices | null = null;
  choicesError: string | null = null;
  disks: IDisks | null = null;
  disksError: string | null = null;
  /** Set while a change or a disk restart is under way: polling then stops. */
  restarting = false;
  /** Why the server stops, once the hub said so (null: not announced). */
  stopping: IStopNotice | null = null;
  /** When this page learnt the server stopped (local clock): the cost stops there. */
  stoppedAt: number | null = null;
  /** A GPU fault the hub announced (its stop notice), shown in the panel until the reload. */
  fault: IStopNotice | null = null;
  /** How the recovery from `fault` goes (the panel's line under it), or null. */
  recovery: string | null = null;

  /** Billed seconds of the session when `server` was fetched, and when (local clock). */
  private _syncedSeconds = 0;
  private _syncedAt = 0;
  private _changed = new Signal<this, void>(this);
  private _timers: number[] = [];

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** Start polling: the GPU every `gpuSeconds`, the server every `serverSeconds`. */
  start(gpuSeconds = 3, serverSeconds = 10): void {
    void this.refreshGPU();
    void this.refreshServer().then(() => this.refreshChoices());
    void this.refreshDisks();
    // a tab in the background asks nothing (the hub serves every open Lab); the cost
    // still ticks from the last sync and is re-synced when the tab is shown again
    const visible = () => !document.hidden;
    this._timers.push(
      window.setInterval(
        () => visible() && void this.refreshGPU(),
        gpuSeconds * 1000
      ),
      window.setInterval(
        () => visible() && void this.refreshServer(),
        serverSeconds * 1000
      )
    );
    document.addEventListener('visibilitychange', this._onVisible);
  }

  dispose(): void {
    this._timers.forEach(timer => window.clearInterval(timer));
    this._timers = [];
    document.removeEventListener('visibilitychange', this._onVisible);
  }

  private _onVisible = (): void => {
    if (!document.hidden) {
      void this.refreshServer();
      void this.refreshGPU();
    }
  };

  async refreshGPU(): Promise<void> {
    if (!this.restarting) {
      await this._fetch<IGPUState>('gpu', gpu => (this.gpu = gpu), e => (this.gpuError = e));
    }
  }

  async refreshServer(): Promise<void> {
    if (!this.restarting && this.stoppedAt === null) {
      await this._fetch<IServer>('server', s => this._sync(s), e => (this.serverError = e));
      // the hub's announcement, if the events stream missed it (a tab in the background)
      try {
        const stop = await requestAPI<IStopNotice | null>('stopping');
        if (stop && !this.restarting) {
          this.stopped(stop);
        }
      } catch {
        // gone already: Lab's connection check tells
      }
    }
  }

  /**
   * The server stops (`stop`: why, when the hub said; null: it is gone unannounced): the
   * cost and the credit left stop counting here, polling ends. A change of GPU restarts
   * the server and is followed by the panel instead. A GPU fault stops the cost too
   * (billing ended at the fault) and is kept in `fault` for the panel.
   */
  stopped(stop: IStopNotice | null): void {
    if (stop?.kind === 'fault') {
      this.fault = stop;
    }
    if (stop?.kind === 'change' || this.restarting) {
      this.stopping = stop ?? this.stopping;
      this._changed.emit();
      return;
    }
    this.stopping = stop ?? this.stopping;
    if (this.stoppedAt === null) {
      this.stoppedAt = Date.now();
      this.dispose();
    }
    this._changed.emit();
  }

  /** Say how the recovery from a GPU fault goes. */
  setRecovery(text: string | null): void {
    this.recovery = text;
    this._changed.emit();
  }

  async refreshChoices(): Promise<void> {
    await this._fetch<IChoices>('choices', c => (this.choices = c), e => (this.choicesError = e));
  }

  async refreshDisks(): Promise<void> {
    await this._fetch<IDisks>('disks', disks => (this.disks = disks), e => (this.disksError = e));
  }

  /**
   * Ask the server extension for `path` and `keep` its answer; `error` gets the message
   * of a failure, or null once it answers (a failure keeps the last answer shown). The
   * views hear of it either way.
   */
  private async _fetch<T>(
    path: string,
    keep: (answer: T) => void,
    error: (message: string | null) => void
  ): Promise<void> {
    try {
      keep(await requestAPI<T>(path));
      error(null);
    } catch (failure) {
      error((failure as Error).message);
    }
    this._changed.emit();
  }

  /** Keep `server`, and the session's billed seconds as of now (the cost ticks from there). */
  private _sync(server: IServer): void {
    this.server = server;
    const session = server.session;
    const asOf = server.account?.as_of;
    if (session) {
      // the exact seconds at billing's own time, so the cost ticks as the billing page's
      this._syncedSeconds = asOf
        ? (Date.parse(asOf) - Date.parse(session.started_at)) / 1000
        : session.billed_seconds ?? (Date.now() - Date.parse(session.started_at)) / 1000;
    }
    this._syncedAt = Date.now();
  }

  /** Seconds since `server` was fetched (for what ticks between two fetches). */
  secondsSinceSync(): number {
    const now = this.stoppedAt ?? Date.now();
    return this._syncedAt ? Math.max(0, now - this._syncedAt) / 1000 : 0;
  }

  /** The running session's seconds now, counted from the last sync (no clock skew). */
  sessionSeconds(): number | null {
    if (!this.server?.session) {
      return null;
    }
    return this._syncedSeconds + this.secondsSinceSync();
  }

  /** What this server cost so far, in micro-credits, or null without a session. */
  costSoFarMicro(): number | null {
    const session = this.server?.session;
    const seconds = this.sessionSeconds();
    if (!session || seconds === null) {
      return null;
    }
    return costMicro(seconds, session.price_per_hour_micro * session.count);
  }

  /**
   * What each pool's running sessions (servers and disks) cost since the account was read,
   * by course ("" for the own credit), counted as billing counts them: each session's
   * cost at the account's own time (`as_of`) plus the time since, so the billing page and
   * this panel show the same numbers at the same moment.
   */
  grownSinceSync(): Record<string, number> {
    const account = this.server?.account;
    const grown: Record<string, number> = {};
    if (!account?.as_of) {
      return grown;
    }
    const elapsed = this._syncedAt ? Date.now() - this._syncedAt : 0;
    // this server's sessions (its workers' too) end with it: past its stop they cost no more
    const own = this.server?.session?.server_name;
    const ownElapsed = this.secondsSinceSync() * 1000;
    for (const s of [...(account.running ?? []), ...(account.storage ?? [])]) {
      const since = own !== undefined && s.server_name === own ? ownElapsed : elapsed;
      const seconds = (Date.parse(account.as_of) - Date.parse(s.started_at) + since) / 1000;
      const now = costMicro(seconds, s.price_per_hour_micro * s.count);
      const key = s.course || '';
      grown[key] = (grown[key] ?? 0) + now - (s.cost_micro ?? 0);
    }
    return grown;
  }

  /** The own credit available now (trial + paid less what runs on it), ticking. */
  creditAvailableMicro(): number | null {
    const credit = this.server?.account?.credit;
    if (!credit) {
      return this.server?.account?.available_micro ?? null;
    }
    return credit.available_micro - (this.grownSinceSync()[''] ?? 0);
  }

  /** What is left of `course`'s allowance now, ticking; null when it is none of theirs. */
  courseAvailableMicro(course: string): number | null {
    const money = this.server?.account?.courses?.find(c => c.course === course);
    if (!money) {
      return null;
    }
    return money.available_micro - (this.grownSinceSync()[course] ?? 0);
  }

  /** How long the account's credit lasts at its rate, counted down since the sync. */
  secondsLeft(): number | null {
    const left = this.server?.account?.seconds_left;
    if (left === null || left === undefined) {
      return null;
    }
    return Math.max(0, left - this.secondsSinceSync());
  }

  /** The choice this server runs on (with course hours left when a course pays). */
  currentChoice(): IChoice | null {
    const server = this.server;
    if (!server || !this.choices) {
      return null;
    }
    const course = server.session?.course || server.course || null;
    return (
      this.choices.choices.find(
        c => c.key === server.offering && (c.course?.slug ?? null) === course
      ) ??
      this.choices.choices.find(c => c.key === server.offering) ??
      null
    );
  }

  /** The currency's name, "credits" unless billing says otherwise. */
  get currency(): string {
    return this.server?.account?.currency ?? this.choices?.currency ?? 'credits';
  }
}

export { RequestError };
