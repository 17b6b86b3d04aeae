/** The panel's "Change GPU" section: pick a choice, confirm, restart on it. */
import { Dialog, showDialog } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { fill, h } from './dom';
import { formatCredits, formatHours } from './format';
import { GPUTapModel, IChangeStatus, IChoice } from './model';
import { RequestError, sendJSON } from './request';
import { confirmRestart } from './restart';
import { RestartRunner, RestartSection } from './section';

/** The text of a choice in the list. */
export function choiceText(choice: IChoice, currency: string, current: boolean): string {
  const parts = [choice.label || choice.key];
  if (choice.course) {
    parts.push(`course ${choice.course.name || choice.course.slug}`);
  }
  // an alternative in a refusal carries no total: never print "undefined"
  const total = typeof choice.total === 'number' ? `/${choice.total}` : '';
  parts.push(choice.free === 0 && !current ? 'sold out' : `${choice.free}${total} free`);
  if (typeof choice.price_per_hour_micro === 'number') {
    parts.push(`${formatCredits(choice.price_per_hour_micro)} ${currency}/h`);
  }
  if (choice.hours_left !== null && choice.hours_left !== undefined) {
    parts.push(`${formatHours(choice.hours_left)} left`);
  }
  if (choice.affordable === false && !current) {
    parts.push('not enough credit');
  }
  return (current ? '(now) ' : '') + parts.join(' · ');
}

export class ChangeSection extends RestartSection {
  private _select = h('select', {
    class: 'jp-mod-styled gputap-select',
    'data-testid': 'gputap-change-select',
    id: 'gputap-change-select',
    'aria-label': 'GPU to change to'
  });
  private _button = h(
    'button',
    {
      class: 'jp-mod-styled jp-mod-accept gputap-button',
      'data-testid': 'gputap-change-button',
      id: 'gputap-change-button'
    },
    'Change GPU…'
  );

  constructor(model: GPUTapModel, restart: RestartRunner) {
    super(model, restart, 'gputap-change', 'gputap-change-message');
    const refresh = h(
      'button',
      { class: 'jp-mod-styled gputap-link', 'data-testid': 'gputap-change-refresh' },
      'refresh'
    );
    refresh.addEventListener('click', () => void this.model.refreshChoices());
    this._button.addEventListener('click', () => void this._change());
    fill(
      this.node,
      h('h3', {}, 'Change GPU ', refresh),
      this._select,
      this._button,
      this.message
    );
  }

  update(): void {
    const { choices, choicesError } = this.model;
    this._button.disabled = !choices || this.model.restarting;
    if (!choices) {
      if (choicesError) {
        this.say(choicesError);
      }
      return;
    }
    // rebuild the list only when it changed, keeping the user's pick
    if (this.showing(choices)) {
      return;
    }
    const picked = this._select.value;
    const current = this.model.currentChoice();
    fill(
      this._select,
      ...choices.choices.map((choice, i) =>
        h(
          'option',
          {
            value: String(i),
            'data-key': choice.key,
            'data-sold-out': choice.free === 0 && choice !== current,
            'data-unaffordable': choice.affordable === false && choice !== current
          },
          choiceText(choice, choices.currency, choice === current)
        )
      )
    );
    if (picked && Number(picked) < choices.choices.length) {
      this._select.value = picked;
    }
  }

  private _picked(): IChoice | null {
    const choices = this.model.choices?.choices ?? [];
    return choices[Number(this._select.value)] ?? null;
  }

  private async _change(): Promise<void> {
    const choice = this._picked();
    if (!choice) {
      return;
    }
    if (choice === this.model.currentChoice()) {
      this.say(`This server already runs on ${choice.label || choice.key}.`);
      return;
    }
    const label = choice.label || choice.key;
    if (choice.affordable === false) {
      // refused before anything stops: the confirm dialog would only lead to a refusal
      this.say(`${label} cannot be started: ${choice.shortfall ?? 'not enough credit'}.`);
      return;
    }
    const soldOut =
      choice.free === 0
        ? ' It is sold out now: you may then wait in the queue for one, or pick another.'
        : '';
    const ok = await confirmRestart(
      'Change GPU',
      `Move this server to ${label} at ${formatCredits(choice.price_per_hour_micro)} ${
        this.model.currency
      }/h.${soldOut}`,
      'Save and change'
    );
    if (!ok) {
      return;
    }
    this.say();
    await this.restart(async () => {
      try {
        return await sendJSON<IChangeStatus>('change', { options: choice.options, queue: false });
      } catch (error) {
        if (
          error instanceof RequestError &&
          error.status === 409 &&
          Array.isArray(error.body?.alternatives) &&
          (await this._offerQueue(error))
        ) {
          return await sendJSON<IChangeStatus>('change', { options: choice.options, queue: true });
        }
        throw error;
      }
    });
  }

  /** Sold out: say so, show what is free instead, offer to wait in the queue. */
  private async _offerQueue(error: RequestError): Promise<boolean> {
    const alternatives = (error.body?.alternatives ?? []) as IChoice[];
    const body = h(
      'div',
      { 'data-testid': 'gputap-sold-out' },
      h('p', {}, error.message),
      alternatives.length
        ? h(
            'div',
            {},
            h('p', {}, 'Free now:'),
            h(
              'ul',
              {},
              ...alternatives.map(a =>
                h('li', {}, choiceText(a, this.model.currency, false))
              )
            )
          )
        : null,
      h(
        'p',
        {},
        'Or wait in the queue: the server stops now and starts on this choice when one is free. ' +
          'Nothing is charged while it waits.'
      )
    );
    const result = await showDialog({
      title: 'Sold out',
      body: new Widget({ node: body }),
      buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Wait in queue' })]
    });
    return result.button.accept;
  }
}
