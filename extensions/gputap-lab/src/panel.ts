/** The side panel: GPU, Cost, Scale out, Change GPU and Disks sections over one model. */
import { Dialog, Notification, showDialog } from '@jupyterlab/apputils';

import { AppsSection } from './appssection';
import { ChangeSection } from './changesection';
import { CostSection } from './costsection';
import { DisksSection } from './diskssection';
import { fill, h } from './dom';
import { GPUSection } from './gpusection';
import { gputapIcon } from './icon';
import { GPUTapModel, IChangeStatus } from './model';
import { RequestError, sendJSON } from './request';
import { IRestartContext, followRestart, reloadAfter, saveEverything } from './restart';
import { ScaleOutSection } from './scaleoutsection';
import { ModelView } from './view';
import { Widget } from '@lumino/widgets';

export class GPUTapPanel extends ModelView {
  private _gpu: GPUSection;
  private _cost: CostSection;
  private _scale: ScaleOutSection;
  private _change: ChangeSection;
  private _disks: DisksSection;
  private _apps = new AppsSection();
  private _stop = h(
    'button',
    { class: 'jp-mod-styled jp-mod-warn gputap-stop', 'data-testid': 'gputap-stop-button' },
    'Stop server'
  );
  /** A GPU fault the hub announced: what broke, what happens next, how it goes. */
  private _faultMessage = h('p', { 'data-testid': 'gputap-fault-message' });
  private _faultTodo = h('p', { 'data-testid': 'gputap-fault-todo' });
  private _faultRecovery = h('p', {
    class: 'gputap-muted',
    'data-testid': 'gputap-fault-recovery'
  });
  private _fault = h(
    'div',
    { class: 'gputap-fault', 'data-testid': 'gputap-fault', role: 'alert' },
    this._faultMessage,
    this._faultTodo,
    this._faultRecovery
  );
  private _progress = h('div', {
    class: 'gputap-progress',
    'data-testid': 'gputap-progress',
    'aria-live': 'polite'
  });

  constructor(
    model: GPUTapModel,
    private _context: IRestartContext
  ) {
    super(model, 'gputap-panel');
    this.title.icon = gputapIcon;
    this.title.caption = 'gputap: GPU, cost, disks';
    const restart = (ask: () => Promise<IChangeStatus>, leaving?: string) =>
      this._runRestart(ask, leaving);
    this._gpu = new GPUSection(model);
    this._cost = new CostSection(model);
    this._scale = new ScaleOutSection(model);
    this._change = new ChangeSection(model, restart);
    this._disks = new DisksSection(model, restart);
    this._progress.hidden = true;
    this._fault.hidden = true;
    this._stop.addEventListener('click', () => void this._askStop());
    fill(
      this.node,
      this._fault,
      this._progress,
      this._gpu.node,
      this._cost.node,
      h('section', { class: 'gputap-section' }, this._stop),
      this._scale.node,
      this._change.node,
      this._disks.node,
      this._apps.node
    );
    this.render();
  }

  protected render(): void {
    this._gpu.update();
    this._cost.update();
    this._scale.update();
    this._change.update();
    this._disks.update();
    const { fault, recovery } = this.model;
    this._fault.hidden = fault === null;
    this._faultMessage.textContent = fault?.message ?? '';
    this._faultTodo.textContent = fault?.todo ?? '';
    this._faultRecovery.textContent = recovery ?? '';
    const server = this.model.server;
    this._stop.disabled =
      this.model.restarting || this.model.stoppedAt !== null || !server?.running;
  }

  /** Confirm, then ask the hub (through the server extension) to stop this server. */
  private async _askStop(): Promise<void> {
    const body = h(
      'div',
      { 'data-testid': 'gputap-stop-confirm' },
      h('p', {}, 'Running kernels stop and what they hold in memory is lost; files are kept.'),
      h('p', {}, 'Billing stops now. Start the server again from the hub\u2019s home page.')
    );
    const answer = await showDialog({
      title: 'Stop this server?',
      body: new Widget({ node: body }),
      buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Stop server' })]
    });
    if (!answer.button.accept) {
      return;
    }
    this._stop.disabled = true;
    try {
      await sendJSON('stop', undefined);
    } catch (error) {
      if (error instanceof RequestError && error.answered) {
        this._showProgress(error.message, true);
        this.render();
      }
      // no answer: the server went away as it answered; its announcement tells the rest
    }
  }

  /**
   * Only the costs run on by themselves; the other sections wait for the model. The
   * Scale out section reads its group while the panel is shown.
   */
  protected tick(): void {
    this._cost.update();
    this._scale.update();
    this._scale.poll(this.isVisible && !document.hidden);
  }

  /**
   * Save everything, ask the hub (`ask`), then follow the restart to a reload. Errors
   * (sold out, refused) are shown and nothing else happens.
   */
  private async _runRestart(
    ask: () => Promise<IChangeStatus>,
    leaving?: string
  ): Promise<void> {
    this.model.restarting = true;
    this.render();
    this._showProgress('Saving open documents and the workspace…');
    let status: IChangeStatus | null;
    let undo = async (): Promise<void> => undefined;
    try {
      undo = await saveEverything(this._context, leaving);
      status = await ask();
    } catch (error) {
      if (error instanceof RequestError && !error.answered) {
        // no answer (the server went away as it answered): the restart may be under way,
        // so follow it; "reload now" stays at hand if nothing happens
        status = null;
      } else {
        this.model.restarting = false;
        this._showProgress((error as Error).message, true);
        this.render();
        await undo(); // refused: what was closed for it opens again
        return;
      }
    }
    this._showProgress(status?.message || 'The server is restarting…');
    const reload = h(
      'button',
      { class: 'jp-mod-styled gputap-link', 'data-testid': 'gputap-reload' },
      'reload now'
    );
    reload.addEventListener('click', () => reloadAfter(null));
    Notification.info('The server is restarting; Lab reloads when it is back.', {
      autoClose: 5000
    });
    await followRestart(status, text => this._showProgress(text, false, reload), 2000, leaving);
  }

  private _showProgress(text: string, error = false, extra?: HTMLElement): void {
    this._progress.hidden = false;
    this._progress.classList.toggle('gputap-error', error);
    fill(this._progress, h('span', {}, text), extra ? ' ' : null, extra ?? null);
  }
}
