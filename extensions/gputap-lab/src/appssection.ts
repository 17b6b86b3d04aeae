/**
 * The panel's Apps section: the apps this server opens (jupyter-server-proxy's servers:
 * TensorBoard, the operator's), each a link, and the URL of the user's own app on a port
 * (`{baseUrl}proxy/PORT/`, reachable through the hub's proxy by this user only), copyable.
 */
import { Clipboard } from '@jupyterlab/apputils';
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { fill, h } from './dom';

interface IProxyServer {
  name: string;
  launcher_entry: { enabled: boolean; title: string; path_info: string };
}

/** `{origin}{baseUrl}proxy/{port}/`: where the user's own app on `port` answers. */
export function portURL(baseUrl: string, port: number): string {
  return URLExt.join(new URL(baseUrl, window.location.href).href, 'proxy', `${port}/`);
}

export class AppsSection {
  readonly node = h('section', { class: 'gputap-section', 'data-testid': 'gputap-apps' });
  private _list = h('ul', { class: 'gputap-apps-list', 'data-testid': 'gputap-apps-list' });
  private _port = h('input', {
    type: 'number',
    min: 1,
    max: 65535,
    value: 8000,
    class: 'gputap-port',
    'aria-label': 'port of your own app',
    'data-testid': 'gputap-port'
  });
  private _url = h('code', { class: 'gputap-port-url', 'data-testid': 'gputap-port-url' });
  private _copy = h(
    'button',
    { class: 'jp-mod-styled gputap-link', 'data-testid': 'gputap-port-copy' },
    'Copy'
  );
  private _baseUrl = ServerConnection.makeSettings().baseUrl;

  constructor() {
    this._port.addEventListener('input', () => this._showURL());
    this._copy.addEventListener('click', () => {
      Clipboard.copyToSystem(this._url.textContent ?? '');
      fill(this._copy, 'Copied');
      setTimeout(() => fill(this._copy, 'Copy'), 1500);
    });
    fill(
      this.node,
      h('h3', {}, 'Apps'),
      this._list,
      h(
        'div',
        { class: 'gputap-row gputap-port-row' },
        h('label', {}, 'Your app on port ', this._port),
        this._copy
      ),
      this._url,
      h(
        'p',
        { class: 'gputap-muted' },
        'Serve on 127.0.0.1 at that port: it answers at this URL, to you only.'
      )
    );
    this._showURL();
    void this._load();
  }

  private _showURL(): void {
    const port = Number(this._port.value);
    const ok = Number.isInteger(port) && port >= 1 && port <= 65535;
    fill(this._url, ok ? portURL(this._baseUrl, port) : 'a port is a whole number, 1 to 65535');
    this._copy.disabled = !ok;
  }

  private async _load(): Promise<void> {
    const settings = ServerConnection.makeSettings();
    const url = URLExt.join(settings.baseUrl, 'server-proxy', 'servers-info');
    let servers: IProxyServer[] = [];
    try {
      const response = await ServerConnection.makeRequest(url, {}, settings);
      if (response.ok) {
        servers = ((await response.json()).server_processes ?? []) as IProxyServer[];
      }
    } catch {
      servers = [];
    }
    const shown = servers.filter(s => s.launcher_entry?.enabled);
    fill(
      this._list,
      ...(shown.length
        ? shown.map(s =>
            h(
              'li',
              { 'data-testid': `gputap-app-${s.name}` },
              h(
                'a',
                {
                  href: URLExt.join(settings.baseUrl, s.launcher_entry.path_info || s.name) + '/',
                  target: '_blank',
                  rel: 'noopener'
                },
                s.launcher_entry.title || s.name
              )
            )
          )
        : [h('li', { class: 'gputap-muted' }, 'No apps in this environment.')])
    );
  }
}
