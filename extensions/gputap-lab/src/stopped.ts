/**
 * When this server stops: why, and what to do (docs/lab.md, "Why a server stopped").
 *
 * The hub tells the server why just before it stops it; the server extension emits that as
 * an event (heard at once on the events stream) and keeps it for `GET gputap/stopping`.
 * This module shows it in a dialog instead of JupyterLab's stock "Server unavailable or
 * unreachable ... restart?", and provides IConnectionLost so that the stock dialog never
 * shows: without an announced reason, the dialog says the server stopped and links to the
 * hub's home page, which says why.
 */
import { IConnectionLost, JupyterFrontEnd } from '@jupyterlab/application';
import { Dialog, Notification, showDialog } from '@jupyterlab/apputils';
import { PageConfig, URLExt } from '@jupyterlab/coreutils';
import { Event } from '@jupyterlab/services';
import { Widget } from '@lumino/widgets';

import { h } from './dom';
import { GPUTapModel, IStopNotice } from './model';
import { requestAPI } from './request';

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

  constructor(
    private _app: JupyterFrontEnd,
    private _model: GPUTapModel
  ) {}

  /** Listen for the hub's announcement on the events stream, and at each server poll. */
  start(): void {
    this._app.serviceManager.events.stream.connect(this._onEvent, this);
    this._model.changed.connect(() => {
      const stop = this._model.stopping;
      if (stop && !this._model.restarting) {
        void this.tell(stop);
      }
    });
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
      h('p', { class: 'gputap-muted' }, 'Open documents were saved up to their last save.')
    );
    const buttons = [Dialog.cancelButton({ label: 'Stay on this page' })];
    if (stop?.kind === 'credit') {
      buttons.push(Dialog.okButton({ label: 'Billing page', caption: links.billing }));
    }
    buttons.push(Dialog.warnButton({ label: 'Hub home', caption: links.home }));
    const result = await showDialog({
      title: stop?.kind === 'credit' ? 'Out of credit: server stopped' : 'Your server stopped',
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
