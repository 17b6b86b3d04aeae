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
    if (course) {
      // course hours are not credit: what is left of the course's, on this option
      const left = model.courseAvailableMicro(course);
      const price = session ? session.price_per_hour_micro * session.count : 0;
      const hours =
        left !== null && price > 0 ? Math.max(0, left) / price : choice?.hours_left ?? null;
      if (hours !== null && hours !== undefined) {
        rows.push(
          row(
            `course ${choice?.course?.name ?? course}`,
            `${formatHours(hours)} left this week`,
            'gputap-hours-left'
          )
        );
      }
    }
    if (account) {
      const available = model.creditAvailableMicro() ?? account.available_micro;
      rows.push(
        row('your credit', `${formatCredits(available)} ${currency} available`, 'gputap-balance')
      );
      // how long what pays for this server lasts: the course's hours, or the credit
      const credit = account.credit;
      const rate = course
        ? session
          ? session.price_per_hour_micro * session.count
          : 0
        : credit?.rate_per_hour_micro ?? account.rate_per_hour_micro;
      const pays = course ? model.courseAvailableMicro(course) : available;
      if (rate > 0 && pays !== null && model.stoppedAt === null) {
        rows.push(
          row(
            course ? 'course hours last' : 'credit lasts',
            `${formatDuration((Math.max(0, pays) * 3600) / rate)} at ${formatCredits(rate)}/h`,
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
