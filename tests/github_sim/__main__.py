"""Run the GitHub stand-in: python -m tests.github_sim --port 8002 --users users.yaml

The users file is YAML:

    users:
      - login: alice
        name: Alice Example
        email: alice@example.org        # public email; leave out to keep it private
      - bob                             # a login alone is enough
    orgs:
      - login: acme
        members: [alice]
        admins: [bob]                   # organization owners
        public_members: [alice]
        teams:
          - slug: gpu-users
            name: GPU users
            members: [alice]
            maintainers: [bob]
            privacy: closed             # or secret

Point the hub at it with hub.github.url: http://127.0.0.1:8002 and the client id and secret
given here.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

import yaml

from .sim import GitHubSim
from .state import DEFAULT_CALLBACK


async def serve(sim: GitHubSim) -> None:
    await sim.start()
    print(f"GitHub stand-in at {sim.url} (client_id {sim.client_id})", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await sim.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tests.github_sim",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--users", help="YAML file declaring users, organizations and teams")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=0, help="port (0: any free)")
    parser.add_argument("--client-id", default="gputap-test-client")
    parser.add_argument("--client-secret", default="gputap-test-secret")
    parser.add_argument(
        "--callback-url",
        default=DEFAULT_CALLBACK,
        help="the app's registered callback URL (a loopback one matches any port)",
    )
    parser.add_argument(
        "--max-per-page", type=int, default=100, help="page size cap of lists (GitHub: 100)"
    )
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(message)s")
    sim = GitHubSim(
        host=args.host,
        port=args.port,
        client_id=args.client_id,
        client_secret=args.client_secret,
        callback_url=args.callback_url,
        max_per_page=args.max_per_page,
    )
    if args.users:
        with open(args.users) as f:
            sim.load(yaml.safe_load(f) or {})
    asyncio.run(serve(sim))


if __name__ == "__main__":
    main()
