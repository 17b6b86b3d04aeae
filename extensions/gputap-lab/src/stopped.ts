/**
 * When this server stops: why, and what to do (docs/lab.md, "Why a server stopped").
 *
 * The hub tells the server why just before it stops it; the server extension emits that as
 * an event (heard at once on the events stream) and keeps it for `GET gputap/stopping`.
 * This module shows it in a dialog instead of JupyterLab's stock "Server unavailable or
 * unreachable ... restart?", and provides IConnectionLost so that the stock dialog never
 * shows: without an announced reason, the dialog says the server stopped and links to the
 * hub's home page, which says why.
 *
 * A GPU fault (kind `fault`) is told at once in an error notification and the panel's fault
 * line, and open documents are saved before the hub stops the server (it waits a few
 * seconds for that). When the hub starts the server again (`restarting`), the page follows
 * that restart as it follows a change of GPU and reloads when the server is back;
 * otherwise the dialog says the server stopped and what to do.
 */
import { IConnectionLost, JupyterFrontEnd } from '@jupyterlab/application';
import { Dialog, Notification, showDialog } from '@jupyterlab/apputils';
import { PageConfig, URLExt } from '@jupyterlab/coreutils';
import { Event } from '@jupyterlab/services';
import { Widget } from '@lumino/widgets';

import { h } from './dom';
import { GPUTapModel, IChangeStatus, IStopNotice } from './model';
import { requestAPI } from './request';
import { IRestartContext, followRestart, saveEverything } from './restart';

export const STOPPING_SCHEMA = 'https://events.gputap.io/gputap_lab/stopping/v1';

/** The hub's home page and billing page, as this Lab page reaches them. */
export function hubLinks(): { home: string; billing: string } {
  const hubPrefix = PageConfig.getOption('hubPrefix') || '/hub/';
  const hubHost = PageConfig.getOption('hubHost') || '';
  const base = hubPrefix.replace(/hub\/?$/, '');
  return {
    home: hubHost + URLExt.join(hubPrefix, 'home'),
    billing: hubHost + URLExt.join(base, 'services/billing/')
  };
}

/** Tells the user once why the server stopped; the model freezes its cost at the stop. */
export class StopTeller {
  private _shown = false;
  private _faulted = false;
  private _context: IRestartContext | null = null;

  constructor(
    private _app: JupyterFrontEnd,
    private _model: GPUTapModel
  ) {}

  /**
   * Listen for the hub's announcement on the events stream, and at each server poll;
   * `context` is what saving open documents needs (a GPU fault saves them at once).
   */
  start(context: IRestartContext): void {
    this._context = context;
    this._app.serviceManager.events.stream.connect(this._onEvent, this);
    this._model.changed.connect(() => {
      const stop = this._model.stopping;
      if (stop?.kind === 'fault') {
        void this._fault(stop);
      } else if (stop && !this._model.restarting) {
        void this.tell(stop);
      }
    });
  }

  /**
   * A GPU fault, once per page: tell it, save open documents before the stop, then follow
   * the hub's restart to a reload, or say the server stopped when the hub does not restart.
   */
  private async _fault(stop: IStopNotice): Promise<void> {
    if (this._faulted) {
      return;
    }
    this._faulted = true;
    Notification.error(`${stop.message} ${stop.todo}`.trim(), { autoClose: false });
    // a change this page already follows reloads it when the server is back
    const following = this._model.restarting;
    const restarting = stop.restarting === true;
    if (restarting) {
      this._model.restarting = true; // Lab's lost connection is then no stop to tell
    }
    this._model.setRecovery('Saving open documents…');
    let saved = true;
    try {
      if (this._context) {
        await saveEverything(this._context);
      }
    } catch {
      saved = false; // the server went first: documents are as last saved
    }
    const kept = saved
      ? 'Open documents were saved.'
      : 'Open documents could not be saved now: they are as last saved.';
    if (!restarting) {
      this._model.setRecovery(kept);
      await this.tell(stop);
      return;
    }
    if (following) {
      this._model.setRecovery(`${kept} The server restarts; Lab reloads when it is back.`);
      return;
    }
    this._model.setRecovery(`${kept} The server is restarting…`);
    // the hub's own status of this recovery, once it has one; until then, this one
    const initial: IChangeStatus = {
      state: 'stopping',
      from: '',
      to: '',
      reason: 'fault',
      message: '',
      started_at: stop.at,
      finished_at: null
    };
    await followRestart(
      initial,
      text => this._model.setRecovery(`${kept} ${text}`),
      2000,
      undefined,
      stop.at
    );
  }

  private _onEvent(_: unknown, event: Event.Emission): void {
    if (event.schema_id !== STOPPING_SCHEMA) {
      return;
    }
    const stop = event as unknown as IStopNotice;
    this._model.stopped(stop);
  }

  /** The IConnectionLost Lab calls when the server cannot be reached. */
  readonly connectionLost: IConnectionLost = async () => {
    if (this._model.restarting || this._shown) {
      return; // a change of GPU follows its own restart; one dialog is enough
    }
    let stop = this._model.stopping;
    if (!stop) {
      try {
        // the announcement may not have reached this page yet (a tab in the background)
        stop = await requestAPI<IStopNotice | null>('stopping');
      } catch {
        stop = null; // gone: the hub's home page says why
      }
    }
    this._model.stopped(stop ?? null);
    if (stop?.kind === 'fault') {
      void this._fault(stop); // once: the model's change may have run it already
      return;
    }
    await this.tell(stop ?? null);
  };

  /** The dialog, once per page. A change of GPU only notes that the server restarts. */
  async tell(stop: IStopNotice | null): Promise<void> {
    if (this._shown) {
      return;
    }
    this._shown = true;
    if (stop?.kind === 'change') {
      Notification.info(`${stop.message} ${stop.todo}`, { autoClose: false });
      return;
    }
    const links = hubLinks();
    const body = h(
      'div',
      { 'data-testid': 'gputap-stopped' },
      h(
        'p',
        { 'data-testid': 'gputap-stopped-message' },
        stop?.message ?? 'This server has stopped.'
      ),
      h(
        'p',
        { 'data-testid': 'gputap-stopped-todo' },
        stop?.todo || 'The hub\u2019s home page says why; start it again from there.'
      ),
      h(
        'p',
        { class: 'gputap-muted' },
        stop?.kind === 'fault'
          ? (this._model.recovery ?? 'Open documents were saved up to their last save.')
          : 'Open documents were saved up to their last save.'
      )
    );
    const buttons = [Dialog.cancelButton({ label: 'Stay on this page' })];
    if (stop?.kind === 'credit') {
      buttons.push(Dialog.okButton({ label: 'Billing page', caption: links.billing }));
    }
    buttons.push(Dialog.warnButton({ label: 'Hub home', caption: links.home }));
    const title =
      stop?.kind === 'credit'
        ? 'Out of credit: server stopped'
        : stop?.kind === 'fault'
          ? 'GPU fault: server stopped'
          : 'Your server stopped';
    const result = await showDialog({
      title,
      body: new Widget({ node: body }),
      buttons
    });
    if (result.button.label === 'Billing page') {
      window.location.href = links.billing;
    } else if (result.button.label === 'Hub home') {
      window.location.href = links.home;
    }
  }
}
