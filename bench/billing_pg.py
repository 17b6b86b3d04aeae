"""Billing on PostgreSQL with 10,000 running sessions: charge throughput, post latency,
one enforcement cycle.

- **Charges.** Every cycle charges each running session for one more interval, as the
  service's charge pass does (``Store.roll_course_weeks``, then
  ``Store.post_interval_charges``, batches of ``--batch`` sessions per transaction). Prints
  charges per second sustained over ``--cycles`` cycles, the post latency of a charge: the
  time from its batch's start to its commit (p50 / p99 / max), and the revenue shards the
  workers credited (one each).
- **Enforcement.** One ``Enforcer.check``: read every running account in bulk, decide, and ask
  a local hub double (real HTTP) to stop the 1 % of accounts that ran out. Prints its time.

Targets (issue 4): at least 2,000 charges/s, p99 post latency under 50 ms, an enforcement
cycle under 1 s. Needs PostgreSQL at ``GPUTAP_TEST_POSTGRES_URL`` (default
postgresql+psycopg://postgres@127.0.0.1:5432/postgres); a scratch database is created and
dropped.

    .venv/bin/python bench/billing_pg.py [--sessions 10000] [--cycles 5] [--batch 50] [--workers 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import insert, select
from tornado import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from billing_service import store as store_module  # noqa: E402
from billing_service.domain import ledger  # noqa: E402
from billing_service.domain.pricing import make_price_book  # noqa: E402
from billing_service.loops.enforce import Enforcer  # noqa: E402
from billing_service.migrate import open_database  # noqa: E402
from billing_service.orm import Account, BillingSession, LedgerAccount  # noqa: E402
from gputap_common.money import format_credits  # noqa: E402
from gputap_common.settings import load_settings  # noqa: E402
from tests.postgres import fresh_postgres_database  # noqa: E402

T0 = datetime(2026, 1, 1, tzinfo=UTC)
INTERVAL = 30


def populate(store: store_module.Store, sessions: int, broke_every: int) -> None:
    """``sessions`` users, each with trial credit and one running RTX-4090 session; every
    ``broke_every``-th user has almost nothing left (enforcement stops those)."""
    with ThreadPoolExecutor(4) as pool:  # setup only: accounts open as at first login
        list(pool.map(lambda i: store.open_account(f"user{i:05d}", T0), range(sessions)))
    with store.engine.begin() as db:
        ids = dict(db.execute(select(Account.username, Account.id)).all())
        db.execute(
            insert(BillingSession),
            [
                {
                    "id": f"s-{name}",
                    "account_id": account_id,
                    "username": name,
                    "server_name": "",
                    "sku": "RTX-4090",
                    "count": 1,
                    "price_per_hour_micro": 5_000_000,
                    "price_class": "on-demand",
                    "started_at": T0,
                    "charged_micro": 0,
                    "course": "",
                }
                for name, account_id in ids.items()
            ],
        )
    broke = sorted(ids)[::broke_every]
    for name in broke:
        store.adjust(name, -9_990_000, "bench: nearly spent", f"bench-{name}", T0)
    with store.engine.connect() as db:
        assert db.scalar(select(LedgerAccount.id).limit(1)) is not None


def charge_cycles(store: store_module.Store, cycles: int, batch: int, workers: int) -> None:
    latencies: list[float] = []
    write = store._write

    def timed_write(work):
        """Each batch is one _write (select, insert, update, commit): its charges' latency."""
        started = time.perf_counter()
        result = write(work)
        elapsed = time.perf_counter() - started
        if isinstance(result, tuple) and len(result) == 3:
            latencies.extend([elapsed] * result[0])
        return result

    store._write = timed_write
    posted = 0
    started = time.perf_counter()
    for cycle in range(1, cycles + 1):
        now = T0 + timedelta(seconds=INTERVAL * cycle + 1)
        store.roll_course_weeks(now)  # the charge loop's first step (loops/charge.py)
        posted += store.post_interval_charges(now, INTERVAL, batch, workers)
    elapsed = time.perf_counter() - started
    store._write = write
    latencies.sort()
    p = lambda q: 1000 * latencies[min(len(latencies) - 1, int(q * len(latencies)))]  # noqa: E731
    rate = posted / elapsed
    print(
        f"charges: {posted} posted in {elapsed:.2f} s over {cycles} cycles = "
        f"{rate:,.0f} charges/s with {workers} worker(s)"
    )
    print(f"  target >= 2,000 charges/s: {verdict(rate >= 2000)}")
    print(
        f"post latency (batch of {batch}, start to commit): p50 {p(0.5):.1f} ms, "
        f"p99 {p(0.99):.1f} ms, max {1000 * latencies[-1]:.1f} ms"
    )
    print(f"  target p99 < 50 ms: {verdict(p(0.99) < 50)}")


def verdict(ok: bool) -> str:
    return "met" if ok else "not met"


class StopHandler(web.RequestHandler):
    def delete(self, *_):
        self.application.settings["stops"].append(self.request.path)
        self.set_status(204)


async def enforcement_cycle(store: store_module.Store, at: datetime, repeats: int) -> None:
    stops: list[str] = []
    app = web.Application([(r"/hub/api/users/.*", StopHandler)], stops=stops)
    server = app.listen(0, "127.0.0.1")
    port = next(iter(server._sockets.values())).getsockname()[1]
    loop = asyncio.get_running_loop()

    async def load(now):
        return await loop.run_in_executor(None, store.accounts_with_running_sessions, now)

    times = []
    for i in range(repeats):
        enforcer = Enforcer(
            load,
            api_url=f"http://127.0.0.1:{port}/hub/api",
            api_token="bench",
            interval_seconds=5,
        )
        started = time.perf_counter()
        asked = await enforcer.check(at + timedelta(seconds=i))
        times.append(time.perf_counter() - started)
    server.stop()
    print(
        f"enforcement cycle over {len(await load(at))} running accounts, {len(asked)} stops "
        f"asked of the hub: median {1000 * statistics.median(times):.0f} ms, "
        f"max {1000 * max(times):.0f} ms of {repeats}"
    )
    print(f"  target median < 1 s: {verdict(statistics.median(times) < 1)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    with fresh_postgres_database("gputap_billing_bench") as url:
        prices = load_settings(environ={}).billing["prices"]
        store = store_module.Store(
            open_database(url),
            make_price_book(prices),
            trial_credit_micro=10_000_000,
            min_billable_seconds=300,
        )
        started = time.perf_counter()
        populate(store, args.sessions, broke_every=100)
        took = time.perf_counter() - started
        print(f"{args.sessions} accounts and running sessions in {took:.1f} s")
        charge_cycles(store, args.cycles, args.batch, args.workers)
        asyncio.run(enforcement_cycle(store, T0 + timedelta(seconds=INTERVAL * args.cycles + 2), 3))
        problems = store.check_ledger()
        print(f"ledger check: {'balanced' if not problems else problems[:3]}")
        with store.engine.connect() as db:
            shards = db.execute(
                select(LedgerAccount.code, LedgerAccount.balance_micro)
                .where(
                    LedgerAccount.code.in_(ledger.REVENUE_CODES), LedgerAccount.balance_micro != 0
                )
                .order_by(LedgerAccount.code)
            ).all()
        print(
            f"revenue {format_credits(store.revenue_micro())} in {len(shards)} of "
            f"{ledger.REVENUE_SHARDS} shards ({', '.join(code[-1] for code, _ in shards)})"
        )
        store.engine.dispose()


if __name__ == "__main__":
    main()
