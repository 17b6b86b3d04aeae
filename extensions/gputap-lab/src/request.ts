/**
 * The one fetch helper: calls the server extension's routes at `{baseUrl}gputap/...`
 * with the page's own session (cookie and XSRF token).
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

/**
 * A failed call. `status` is 0 when nothing came back (the server is away) and
 * `body` is the error's JSON when there was one (`message`, and e.g. `alternatives`).
 */
export class RequestError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly body: Record<string, any> | null = null
  ) {
    super(message);
  }

  /** Whether the answer came from this server extension or the hub behind it, as JSON. */
  get answered(): boolean {
    return this.body !== null;
  }
}

/**
 * Call `gputap/{endPoint}` and answer its JSON.
 *
 * Anything but JSON (the hub's HTML page while this server restarts, a proxy error)
 * is a RequestError with a null body, as is a network failure.
 */
export async function requestAPI<T>(
  endPoint: string,
  init: RequestInit = {}
): Promise<T> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, 'gputap', endPoint);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(
      url,
      { cache: 'no-store', ...init },
      settings
    );
  } catch (error) {
    throw new RequestError(0, `The server cannot be reached (${error}).`);
  }
  const text = await response.text();
  let data: any = undefined;
  if (text.length > 0) {
    try {
      data = JSON.parse(text);
    } catch {
      throw new RequestError(
        response.status,
        `The server answered ${response.status} with a page, not JSON: it is probably restarting.`
      );
    }
  }
  if (!response.ok) {
    const body = data && typeof data === 'object' ? data : {};
    const message =
      typeof body.message === 'string' && body.message
        ? body.message
        : `The server answered ${response.status}.`;
    throw new RequestError(response.status, message, body);
  }
  return data as T;
}

/** POST (or another verb) with a JSON body. */
export function sendJSON<T>(
  endPoint: string,
  body: unknown,
  method = 'POST'
): Promise<T> {
  return requestAPI<T>(endPoint, {
    method,
    body: body === undefined ? undefined : JSON.stringify(body),
    headers: { 'Content-Type': 'application/json' }
  });
}
