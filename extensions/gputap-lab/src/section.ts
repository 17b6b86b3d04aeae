/** What the Change GPU and Disks sections share: both restart the server and say how it went. */
import { fill, h } from './dom';
import { GPUTapModel, IChangeStatus } from './model';

/**
 * Runs a restart: `ask` gets the hub's status, then the panel follows it. `leaving`: a
 * folder the restart takes away (a disk being detached), which Lab leaves first.
 */
export type RestartRunner = (
  ask: () => Promise<IChangeStatus>,
  leaving?: string
) => Promise<void>;

/** A panel section whose actions may restart the server, with a line saying what they did. */
export abstract class RestartSection {
  readonly node: HTMLElement;
  protected readonly message: HTMLParagraphElement;
  private _shown = '';

  constructor(
    protected readonly model: GPUTapModel,
    protected readonly restart: RestartRunner,
    testid: string,
    messageTestid: string
  ) {
    this.node = h('section', { class: 'gputap-section', 'data-testid': testid });
    this.message = h('p', { class: 'gputap-message', 'data-testid': messageTestid });
  }

  /** Show the model as it is now; called on every change of it. */
  abstract update(): void;

  /** Put `text` on the message line, or empty it. */
  protected say(text?: string): void {
    fill(this.message, text);
  }

  /**
   * Whether `state` is what the section shows already. Updates come on every poll; the
   * section rebuilds only when something changed, so a pick or a click in progress stays.
   */
  protected showing(state: unknown): boolean {
    const shown = JSON.stringify(state);
    if (shown === this._shown) {
      return true;
    }
    this._shown = shown;
    return false;
  }
}
