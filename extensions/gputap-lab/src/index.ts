/**
 * gputap-lab: live GPU use and cost in the status bar and a side panel; change of GPU
 * and data disks without losing open work. One plugin.
 */
import {
  IConnectionLost,
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { IWindowResolver, Notification } from '@jupyterlab/apputils';
import { IStateDB } from '@jupyterlab/statedb';
import { IStatusBar } from '@jupyterlab/statusbar';

import { GPUTapModel } from './model';
import { GPUTapPanel } from './panel';
import { tellRestartOutcome } from './restart';
import { GPUTapStatus } from './statusbar';
import { StopTeller } from './stopped';

const WARNED_KEY = 'gputap:warned';

/** The notifications of billing's warnings shown on this page (dismissed at a stop). */
const shownWarnings: string[] = [];

/** One model and one stop teller per page, for both plugins (whichever starts first). */
let shared: { model: GPUTapModel; teller: StopTeller } | null = null;

function sharedFor(app: JupyterFrontEnd): { model: GPUTapModel; teller: StopTeller } {
  if (!shared) {
    const model = new GPUTapModel();
    shared = { model, teller: new StopTeller(app, model) };
  }
  return shared;
}

/** Show each of billing's warnings once (per browser tab), as a notification; none once
 * the server stopped (those shown are dismissed: they no longer apply). */
function warnOnce(model: GPUTapModel): void {
  if (model.stoppedAt !== null) {
    shownWarnings.splice(0).forEach(id => Notification.dismiss(id));
    return;
  }
  let warned: string[] = [];
  try {
    warned = JSON.parse(window.sessionStorage.getItem(WARNED_KEY) || '[]');
  } catch {
    warned = [];
  }
  for (const warning of model.server?.account?.warnings ?? []) {
    const key = `${model.server?.session?.id ?? ''}:${warning.course ?? ''}:${warning.threshold_seconds}`;
    if (warned.includes(key)) {
      continue;
    }
    warned.push(key);
    shownWarnings.push(Notification.warning(warning.message, { autoClose: false }));
  }
  try {
    window.sessionStorage.setItem(WARNED_KEY, JSON.stringify(warned));
  } catch {
    // private mode: a warning may show again after a reload
  }
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'gputap-lab:plugin',
  description: 'gputap: GPU use, cost and credit, change of GPU, data disks.',
  autoStart: true,
  optional: [IStatusBar, IStateDB, IWindowResolver, ILayoutRestorer],
  activate: (
    app: JupyterFrontEnd,
    statusBar: IStatusBar | null,
    state: IStateDB | null,
    resolver: IWindowResolver | null,
    restorer: ILayoutRestorer | null
  ) => {
    const { model, teller } = sharedFor(app);
    const panel = new GPUTapPanel(model, { app, state, resolver });
    app.shell.add(panel, 'right', { rank: 900 });
    // reopened after a reload (a change of GPU reloads Lab) as it was left
    restorer?.add(panel, panel.id);
    if (statusBar) {
      const item = new GPUTapStatus(model, () => app.shell.activateById(panel.id));
      statusBar.registerStatusItem('gputap-lab:status', {
        item,
        align: 'left',
        rank: 100
      });
    }
    model.changed.connect(() => warnOnce(model));
    void app.restored.then(() => {
      tellRestartOutcome();
      model.start();
      teller.start({ app, state, resolver });
    });
  }
};

/**
 * Why the server stopped, instead of JupyterLab's stock "Server unavailable or unreachable"
 * dialog (package.json disables @jupyterlab/hub-extension:connectionlost, which shows it).
 */
const connectionLost: JupyterFrontEndPlugin<IConnectionLost> = {
  id: 'gputap-lab:connectionlost',
  description: 'Says why the server stopped and what to do, when Lab loses it.',
  autoStart: true,
  provides: IConnectionLost,
  activate: (app: JupyterFrontEnd): IConnectionLost => sharedFor(app).teller.connectionLost
};

export default [plugin, connectionLost];
