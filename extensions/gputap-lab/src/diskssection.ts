/** The panel's Disks section: list, create (price shown first), attach, detach, delete. */
import { Dialog, showDialog } from '@jupyterlab/apputils';

import { fill, h } from './dom';
import { formatBytes, formatCredits, formatDate } from './format';
import { GPUTapModel, IChangeStatus, IDisk } from './model';
import { RequestError, requestAPI, sendJSON } from './request';
import { confirmRestart } from './restart';
import { RestartRunner, RestartSection } from './section';

/** The rule of disk names, as the hub checks it. */
export const DISK_NAME = /^[a-z][a-z0-9-]{0,31}$/;

export class DisksSection extends RestartSection {
  private _list = h('div', { class: 'gputap-disk-list', 'data-testid': 'gputap-disk-list' });
  private _name = h('input', {
    class: 'jp-mod-styled gputap-input',
    id: 'gputap-disk-name',
    'data-testid': 'gputap-disk-name',
    placeholder: 'name (a-z, 0-9, -)',
    maxlength: 32,
    'aria-label': 'New disk name'
  });
  private _size = h('input', {
    class: 'jp-mod-styled gputap-input gputap-size',
    id: 'gputap-disk-size',
    'data-testid': 'gputap-disk-size',
    type: 'number',
    min: 1,
    step: 1,
    value: 10,
    'aria-label': 'New disk size in GB'
  });
  private _price = h('p', { class: 'gputap-muted', 'data-testid': 'gputap-disk-price' });
  private _create = h(
    'button',
    {
      class: 'jp-mod-styled jp-mod-accept gputap-button',
      id: 'gputap-disk-create',
      'data-testid': 'gputap-disk-create'
    },
    'Create disk'
  );

  constructor(model: GPUTapModel, restart: RestartRunner) {
    super(model, restart, 'gputap-disks', 'gputap-disk-message');
    this._size.addEventListener('input', () => this._showPrice());
    this._create.addEventListener('click', () => void this._createDisk());
    fill(
      this.node,
      h('h3', {}, 'Disks'),
      this._list,
      h(
        'div',
        { class: 'gputap-disk-form', 'data-testid': 'gputap-disk-form' },
        this._name,
        h('label', { class: 'gputap-size-label' }, this._size, ' GB'),
        this._create
      ),
      this._price,
      this.message
    );
  }

  update(): void {
    const { disks, disksError } = this.model;
    if (this.showing([disks, disksError, this.model.restarting, this._serverName()])) {
      return;
    }
    this._create.disabled = !disks || this.model.restarting;
    if (!disks) {
      fill(this._list, h('p', { class: disksError ? 'gputap-error' : 'gputap-muted' }, disksError || '…'));
      return;
    }
    this._size.max = String(disks.limits.max_size_gb);
    this._showPrice();
    if (!disks.disks.length) {
      fill(this._list, h('p', { class: 'gputap-muted' }, 'No disks yet.'));
      return;
    }
    fill(this._list, ...disks.disks.map(disk => this._row(disk)));
  }

  private _serverName(): string | null {
    return this.model.server ? this.model.server.server : null;
  }

  private _row(disk: IDisk): HTMLElement {
    const here = disk.attached_to !== null && disk.attached_to === this._serverName();
    let where: string;
    if (disk.attached_to === null) {
      where = 'not attached';
    } else if (here) {
      where = 'attached here';
    } else {
      where = `attached to ${disk.attached_to || 'the default server'}${
        disk.attached_running ? ' (running)' : ''
      }`;
    }
    const actions: HTMLElement[] = [];
    const busy = this.model.restarting;
    if (here) {
      actions.push(this._action('Detach', `gputap-disk-detach-${disk.name}`, busy, () => this._move(disk, 'detach')));
    } else if (!(disk.attached_to !== null && disk.attached_running)) {
      actions.push(this._action('Attach here', `gputap-disk-attach-${disk.name}`, busy, () => this._move(disk, 'attach')));
    }
    if (disk.attached_to === null) {
      actions.push(this._action('Delete', `gputap-disk-delete-${disk.name}`, busy, () => this._delete(disk)));
    }
    return h(
      'div',
      { class: 'gputap-disk', 'data-testid': `gputap-disk-${disk.name}`, 'data-disk': disk.name },
      h(
        'div',
        { class: 'gputap-row' },
        h('span', { class: 'gputap-disk-name' }, disk.name),
        h('span', {}, `${disk.size_gb} GB`)
      ),
      h(
        'div',
        { class: 'gputap-muted' },
        `created ${formatDate(disk.created_at)} · ${where}`,
        disk.used_bytes !== null && disk.used_bytes !== undefined
          ? ` · ${formatBytes(disk.used_bytes)} used`
          : ''
      ),
      h('div', { class: 'gputap-actions' }, ...actions)
    );
  }

  private _action(label: string, testid: string, disabled: boolean, run: () => Promise<void>): HTMLElement {
    const button = h(
      'button',
      { class: 'jp-mod-styled gputap-button', 'data-testid': testid, id: testid, disabled },
      label
    );
    button.addEventListener('click', () => void run());
    return button;
  }

  /** The hourly price of the size typed, before anything is created. */
  private _showPrice(): void {
    const disks = this.model.disks;
    if (!disks) {
      return;
    }
    const size = Number(this._size.value);
    const perGB = disks.price_per_gb_hour_micro;
    const currency = disks.currency || this.model.currency;
    const limit = `up to ${disks.limits.max_size_gb} GB, ${disks.limits.max_disks} disks`;
    if (!Number.isInteger(size) || size < 1) {
      fill(this._price, `${formatCredits(perGB)} ${currency} per GB-hour · ${limit}`);
      return;
    }
    fill(
      this._price,
      `${formatCredits(perGB)} ${currency} per GB-hour · ${size} GB: ` +
        `${formatCredits(perGB * size)} ${currency}/h · ${limit}`
    );
  }

  private async _createDisk(): Promise<void> {
    const name = this._name.value.trim();
    const size = Number(this._size.value);
    const max = this.model.disks?.limits.max_size_gb ?? Infinity;
    if (!DISK_NAME.test(name)) {
      this.say('A disk name is 1 to 32 of a-z, 0-9 and -, starting with a letter.');
      return;
    }
    if (!Number.isInteger(size) || size < 1 || size > max) {
      this.say(`The size is a whole number of GB from 1 to ${max}.`);
      return;
    }
    this._create.disabled = true;
    try {
      await sendJSON<IDisk>('disks', { name, size_gb: size });
      this.say(`Disk ${name} created (${size} GB). Attach it to use it here.`);
      this._name.value = '';
    } catch (error) {
      this.say((error as Error).message);
    } finally {
      this._create.disabled = false;
    }
    await this.model.refreshDisks();
  }

  private async _move(disk: IDisk, action: 'attach' | 'detach'): Promise<void> {
    const ok = await confirmRestart(
      action === 'attach' ? 'Attach disk' : 'Detach disk',
      action === 'attach'
        ? `Attach disk ${disk.name} (${disk.size_gb} GB) to this server: it appears in ~/disks/${disk.name}.`
        : `Detach disk ${disk.name} from this server: its files stay on the disk. Documents ` +
          `open from ~/disks/${disk.name} are closed, and the file browser leaves it.`,
      action === 'attach' ? 'Save and attach' : 'Save and detach'
    );
    if (!ok) {
      return;
    }
    // the hub answers with the disk and the status of the restart that mounts it; a
    // detached disk's folder is gone after it, so Lab leaves the folder first
    await this.restart(
      async () => {
        const answer = await sendJSON<{ restart: IChangeStatus }>(
          `disks/${encodeURIComponent(disk.name)}/${action}`,
          {}
        );
        return answer.restart;
      },
      action === 'detach' ? `disks/${disk.name}` : undefined
    );
  }

  private async _delete(disk: IDisk): Promise<void> {
    const result = await showDialog({
      title: 'Delete disk',
      body: `Delete disk ${disk.name} (${disk.size_gb} GB) and every file on it? This cannot be undone.`,
      buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Delete' })]
    });
    if (!result.button.accept) {
      return;
    }
    try {
      await requestAPI<void>(`disks/${encodeURIComponent(disk.name)}`, { method: 'DELETE' });
      this.say(`Disk ${disk.name} deleted.`);
    } catch (error) {
      this.say(error instanceof RequestError ? error.message : String(error));
    }
    await this.model.refreshDisks();
  }
}
