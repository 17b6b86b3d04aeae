/**
 * Restarting this server for a change of GPU or of disks, without losing anything:
 * confirm, save every open document, flush the workspace (layout, open tabs) to the server,
 * ask the hub, then follow the restart and reload Lab on the same workspace.
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import {
  Dialog,
  IWindowResolver,
  Notification,
  showDialog
} from '@jupyterlab/apputils';
import { IStateDB } from '@jupyterlab/statedb';
import { Widget } from '@lumino/widgets';

import { IChangeStatus, IServer } from './model';
import { RequestError, requestAPI } from './request';

const AFTER_RELOAD_KEY = 'gputap:after-reload';
const TERMINAL = ['done', 'failed', 'reverted'];

/** What a restart needs of the application. */
export interface IRestartContext {
  app: JupyterFrontEnd;
  state: IStateDB | null;
  resolver: IWindowResolver | null;
}

/** Ask the user before a restart; true to go ahead. */
export async function confirmRestart(
  title: string,
  what: string,
  accept: string
): Promise<boolean> {
  const body = document.createElement('div');
  body.dataset.testid = 'gputap-confirm';
  for (const text of [
    what,
    'This restarts the server: running kernels stop and start again, so variables in memory are lost.',
    'Open documents are saved first, and Lab comes back with the same tabs. Files and disks are kept.'
  ]) {
    const p = document.createElement('p');
    p.textContent = text;
    body.appendChild(p);
  }
  const result = await showDialog({
    title,
    body: new Widget({ node: body }),
    buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: accept })]
  });
  return result.button.accept;
}

/**
 * Save every open document and write the workspace to the server, and wait for both.
 * `leaving`: a folder the restart takes away (a disk being detached): its documents are
 * closed and the file browser leaves it before the workspace is written, so Lab does not
 * come back to paths that no longer exist. Returns what puts them back (when the hub
 * refuses the restart).
 */
export async function saveEverything(
  context: IRestartContext,
  leaving?: string
): Promise<() => Promise<void>> {
  const { app, state, resolver } = context;
  if (app.commands.hasCommand('docmanager:save-all')) {
    await app.commands.execute('docmanager:save-all');
  }
  const undo = leaving ? await leaveFolder(context, leaving) : async () => undefined;
  // the layout restorer writes the shell's layout into the state database on change;
  // give it a moment, then save the workspace ourselves instead of trusting the debouncer
  await sleep(300);
  if (state && resolver) {
    const id = resolver.name;
    const data = await state.toJSON();
    await app.serviceManager.workspaces.save(id, { data, metadata: { id } });
  }
  return undo;
}

/** The file browser's folder, as it keeps it in the state database. */
const BROWSER_CWD_KEY = 'file-browser-filebrowser:cwd';

/** Whether `path` is `folder` or inside it. */
export function inFolder(path: string, folder: string): boolean {
  const clean = (p: string) => p.replace(/^\/+|\/+$/g, '');
  const [p, f] = [clean(path), clean(folder)];
  return p === f || p.startsWith(`${f}/`);
}

/**
 * Close the (saved) documents inside `folder` and take the file browser out of it, to
 * the home folder; returns what reopens them and goes back.
 */
async function leaveFolder(
  context: IRestartContext,
  folder: string
): Promise<() => Promise<void>> {
  const { app, state } = context;
  const closed: string[] = [];
  for (const widget of Array.from(app.shell.widgets('main'))) {
    // a document widget carries its context (DocumentWidget.context.path)
    const path = (widget as unknown as { context?: { path?: string } }).context?.path;
    if (typeof path === 'string' && inFolder(path, folder)) {
      closed.push(path);
      widget.close();
    }
  }
  const cwd = state
    ? ((await state.fetch(BROWSER_CWD_KEY)) as { path?: string } | undefined)
    : undefined;
  const browsed = cwd?.path && inFolder(cwd.path, folder) ? cwd.path : null;
  if (browsed && app.commands.hasCommand('filebrowser:go-to-path')) {
    await app.commands.execute('filebrowser:go-to-path', { path: '', dontShowBrowser: true });
  }
  return async () => {
    if (browsed && app.commands.hasCommand('filebrowser:go-to-path')) {
      await app.commands.execute('filebrowser:go-to-path', {
        path: browsed,
        dontShowBrowser: true
      });
    }
    for (const path of closed) {
      await app.commands.execute('docmanager:open', { path });
    }
  };
}

/**
 * Follow a restart until this server answers again, running and on its new options,
 * then reload Lab. `progress` is told what is happening every poll. `since` (ISO time):
 * a status that finished before it is an earlier change's, not this restart's (a restart
 * the hub began by itself, after a GPU fault, may not have its status yet).
 */
export async function followRestart(
  initial: IChangeStatus | null,
  progress: (text: string) => void,
  intervalMs = 2000,
  leaving?: string,
  since?: string
): Promise<void> {
  let status = initial;
  let seenDown = false;
  const started = Date.now();
  for (;;) {
    await sleep(intervalMs);
    try {
      const fresh = await requestAPI<IChangeStatus>('change');
      if (!since || !fresh.finished_at || Date.parse(fresh.finished_at) >= Date.parse(since)) {
        status = fresh;
      }
    } catch {
      // while the server is away the hub answers in its place: keep the last status
    }
    let server: IServer | null = null;
    try {
      server = await requestAPI<IServer>('server');
    } catch (error) {
      if (seenDown && error instanceof RequestError && error.status === 403) {
        // back, but this page's login is for the old server: a reload logs in again
        reloadAfter(status, leaving);
        return;
      }
      seenDown = true;
    }
    const elapsed = Math.round((Date.now() - started) / 1000);
    progress(describe(status, server === null, elapsed));
    const terminal = status !== null && TERMINAL.includes(status.state);
    if (server && server.running && !server.pending && (seenDown || terminal)) {
      reloadAfter(status, leaving);
      return;
    }
  }
}

/**
 * Reload Lab, leaving the outcome for the next page to tell. When the page's address opens
 * a path inside `leaving` (`lab/tree/disks/NAME/…`, gone after the restart), Lab is loaded
 * without that path instead, so it opens no path that no longer exists.
 */
export function reloadAfter(status: IChangeStatus | null, leaving?: string): void {
  if (status) {
    try {
      window.sessionStorage.setItem(AFTER_RELOAD_KEY, JSON.stringify(status));
    } catch {
      // private mode: the outcome is not told, nothing else is lost
    }
  }
  const url = new URL(window.location.href);
  const tree = url.pathname.indexOf('/tree/');
  if (
    leaving &&
    tree >= 0 &&
    inFolder(decodeURIComponent(url.pathname.slice(tree + '/tree/'.length)), leaving)
  ) {
    url.pathname = url.pathname.slice(0, tree);
    window.location.assign(url.toString());
    return;
  }
  window.location.reload();
}

/** After a reload: tell how the restart ended (once). */
export function tellRestartOutcome(): void {
  let status: IChangeStatus | null = null;
  try {
    const saved = window.sessionStorage.getItem(AFTER_RELOAD_KEY);
    window.sessionStorage.removeItem(AFTER_RELOAD_KEY);
    status = saved ? JSON.parse(saved) : null;
  } catch {
    return;
  }
  if (!status) {
    return;
  }
  if (status.reason === 'fault') {
    tellRecoveryOutcome(status);
    return;
  }
  const text = status.message || `${status.from} → ${status.to}: ${status.state}`;
  if (status.state === 'done') {
    Notification.success(text, { autoClose: 8000 });
  } else if (status.state === 'reverted' || status.state === 'failed') {
    Notification.warning(text, { autoClose: false });
  } else {
    Notification.info(text, { autoClose: 8000 });
  }
}

/**
 * After a GPU fault's recovery: Lab reloads only once the server runs again, so unless the
 * hub says the recovery failed, the server is back, on a healthy GPU.
 */
function tellRecoveryOutcome(status: IChangeStatus): void {
  if (status.state === 'failed' || status.state === 'reverted') {
    Notification.warning(status.message || 'The recovery from the GPU fault failed.', {
      autoClose: false
    });
    return;
  }
  const on = status.to ? ` (${status.to})` : '';
  Notification.success(
    `Your server is back on a healthy GPU${on} after the GPU fault; kernels start afresh.`,
    { autoClose: 8000 }
  );
}

function describe(
  status: IChangeStatus | null,
  away: boolean,
  elapsed: number
): string {
  const state = status?.state;
  const target = status?.to ? ` ${status.to}` : '';
  let text: string;
  if (state === 'stopping') {
    text = 'Stopping the server…';
  } else if (state === 'waiting') {
    text = `Waiting in the queue for${target || ' a free GPU'} (nothing is charged while waiting)…`;
  } else if (state === 'starting') {
    text = `Starting the server on${target || ' its new options'}…`;
  } else if (away) {
    text = 'The server is restarting…';
  } else {
    text = 'Restarting…';
  }
  if (status?.message) {
    text += ` ${status.message}`;
  }
  return `${text} (${elapsed} s)`;
}

function sleep(ms: number): Promise<void> {
  return new Promise(resolve => window.setTimeout(resolve, ms));
}
