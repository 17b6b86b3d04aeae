/** The side panel: GPU, Cost, Change GPU and Disks sections over one model. */
import { Notification } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { ChangeSection } from './changesection';
import { CostSection } from './costsection';
import { DisksSection } from './diskssection';
import { fill, h } from './dom';
import { GPUSection } from './gpusection';
import { gputapIcon } from './icon';
import { GPUTapModel, IChangeStatus } from './model';
import { RequestError } from './request';
import { IRestartContext, followRestart, reloadAfter, saveEverything } from './restart';

export class GPUTapPanel extends Widget {
  private _gpu: GPUSection;
  private _cost: CostSection;
  private _change: ChangeSection;
  private _disks: DisksSection;
  private _progress = h('div', {
    class: 'gputap-progress',
    'data-testid': 'gputap-progress',
    'aria-live': 'polite'
  });
  private _ticker: number;

  constructor(
    private _model: GPUTapModel,
    private _context: IRestartContext
  ) {
    super();
    this.id = 'gputap-panel';
    this.addClass('gputap-panel');
    this.node.dataset.testid = 'gputap-panel';
    this.title.icon = gputapIcon;
    this.title.caption = 'gputap: GPU, cost, disks';
    const restart = (ask: () => Promise<IChangeStatus>) => this._runRestart(ask);
    this._gpu = new GPUSection(_model);
    this._cost = new CostSection(_model);
    this._change = new ChangeSection(_model, restart);
    this._disks = new DisksSection(_model, restart);
    this._progress.hidden = true;
    fill(
      this.node,
      this._progress,
      this._gpu.node,
      this._cost.node,
      this._change.node,
      this._disks.node
    );
    _model.changed.connect(this._update, this);
    this._ticker = window.setInterval(() => this._cost.update(), 1000);
    this._update();
  }

  dispose(): void {
    window.clearInterval(this._ticker);
    this._model.changed.disconnect(this._update, this);
    super.dispose();
  }

  private _update(): void {
    this._gpu.update();
    this._cost.update();
    this._change.update();
    this._disks.update();
  }

  /**
   * Save everything, ask the hub (`ask`), then follow the restart to a reload. Errors
   * (sold out, refused) are shown and nothing else happens.
   */
  private async _runRestart(ask: () => Promise<IChangeStatus>): Promise<void> {
    this._model.restarting = true;
    this._update();
    this._showProgress('Saving open documents and the workspace…');
    let status: IChangeStatus | null;
    try {
      await saveEverything(this._context);
      status = await ask();
    } catch (error) {
      if (error instanceof RequestError && !error.answered) {
        // no answer (the server went away as it answered): the restart may be under way,
        // so follow it; "reload now" stays at hand if nothing happens
        status = null;
      } else {
        this._model.restarting = false;
        this._showProgress((error as Error).message, true);
        this._update();
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
    await followRestart(status, text => this._showProgress(text, false, reload));
  }

  private _showProgress(text: string, error = false, extra?: HTMLElement): void {
    this._progress.hidden = false;
    this._progress.classList.toggle('gputap-error', error);
    fill(this._progress, h('span', {}, text), extra ? ' ' : null, extra ?? null);
  }
}
