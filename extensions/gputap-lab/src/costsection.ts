/** The panel's cost section: price, cost so far (ticking), credit or course hours left. */
import { fill, h } from './dom';
import { formatCredits, formatDuration, formatHours } from './format';
import { GPUTapModel } from './model';

export class CostSection {
  readonly node = h('section', { class: 'gputap-section', 'data-testid': 'gputap-cost' });
  private _body = h('div', {});
  private _warnings = h('div', { class: 'gputap-warnings', 'data-testid': 'gputap-warnings' });

  constructor(private _model: GPUTapModel) {
    fill(this.node, h('h3', {}, 'Cost'), this._body, this._warnings);
  }

  /** Called every second (the cost ticks) and on every model change. */
  update(): void {
    const model = this._model;
    const { server, serverError } = model;
    if (!server) {
      fill(
        this._body,
        h('p', { class: serverError ? 'gputap-error' : 'gputap-muted' }, serverError || '…')
      );
      fill(this._warnings);
      return;
    }
    const currency = model.currency;
    const session = server.session;
    const account = server.account;
    const rows: HTMLElement[] = [];
    if (model.stoppedAt !== null) {
      // stopped: the cost is what it was at the stop, and warnings no longer apply
      rows.push(row('stopped', stoppedText(model.stoppedAt), 'gputap-stopped-at'));
    }
    if (session) {
      rows.push(
        row('price', `${formatCredits(session.price_per_hour_micro)} ${currency}/h`, 'gputap-price'),
        row(
          'this server so far',
          `${formatCredits(model.costSoFarMicro() ?? 0)} ${currency}`,
          'gputap-cost-so-far'
        )
      );
    } else {
      rows.push(row('price', 'not billed now', 'gputap-price'));
    }
    const choice = model.currentChoice();
    const course = session?.course || server.course;
    if (course && choice?.hours_left !== null && choice?.hours_left !== undefined) {
      rows.push(
        row(
          `course ${choice.course?.name ?? course}`,
          `${formatHours(choice.hours_left)} left this week`,
          'gputap-hours-left'
        )
      );
    }
    if (account) {
      rows.push(
        row('available', `${formatCredits(account.available_micro)} ${currency}`, 'gputap-balance')
      );
      const left = model.secondsLeft();
      if (left !== null && model.stoppedAt === null) {
        rows.push(
          row(
            'lasts',
            `${formatDuration(left)} at ${formatCredits(account.rate_per_hour_micro)}/h`,
            'gputap-time-left'
          )
        );
      }
    }
    fill(this._body, ...rows);
    const warnings = model.stoppedAt === null ? (account?.warnings ?? []) : [];
    fill(
      this._warnings,
      ...warnings.map(w =>
        h('p', { class: 'gputap-warning', 'data-testid': 'gputap-warning' }, w.message)
      )
    );
  }
}

function stoppedText(at: number): string {
  const time = new Date(at).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' });
  return `at ${time}; nothing more is charged`;
}

function row(label: string, value: string, testid: string): HTMLElement {
  return h(
    'div',
    { class: 'gputap-row', 'data-testid': testid },
    h('span', { class: 'gputap-label' }, label),
    h('span', { class: 'gputap-value' }, value)
  );
}
