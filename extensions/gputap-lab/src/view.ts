/** What the panel and the status bar share: a widget over the model that keeps itself current. */
import { Widget } from '@lumino/widgets';

import { GPUTapModel } from './model';

/**
 * Renders on every change of the model and ticks each second: the cost and the credit left
 * run on between two fetches. The id, class and test id are one name.
 */
export abstract class ModelView extends Widget {
  private _ticker: number;

  constructor(
    protected readonly model: GPUTapModel,
    name: string
  ) {
    super();
    this.id = name;
    this.addClass(name);
    this.node.dataset.testid = name;
    model.changed.connect(this.render, this);
    this._ticker = window.setInterval(() => this.tick(), 1000);
  }

  dispose(): void {
    window.clearInterval(this._ticker);
    this.model.changed.disconnect(this.render, this);
    super.dispose();
  }

  /** Show the model as it is now. */
  protected abstract render(): void;

  /** What each second changes by itself; all of it unless a view knows less will do. */
  protected tick(): void {
    this.render();
  }
}
