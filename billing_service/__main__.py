"""``python -m billing_service`` runs the service; ``... upgrade-db`` migrates its database."""

import argparse
import asyncio
import contextlib
import logging
import sys

from gputap_common.settings import exit_on_refusal

from .app import BadCookieSecret, main
from .config import load_billing_config
from .loops import KubeConfigMissing
from .migrate import SchemaMismatch, upgrade_database
from .orm import make_engine


def upgrade_db() -> int:
    """Upgrade the configured billing database to the newest schema; print what was done."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    with exit_on_refusal("billing"):
        engine = make_engine(load_billing_config().database_url)
    try:
        print(upgrade_database(engine))
    except SchemaMismatch as e:
        print(e, file=sys.stderr)
        return 1
    finally:
        engine.dispose()
    return 0


parser = argparse.ArgumentParser(
    prog="python -m billing_service",
    description="The gputap billing service (settings from GPUTAP_SETTINGS, GPUTAP__BILLING__*).",
)
parser.add_argument(
    "command",
    nargs="?",
    choices=["upgrade-db"],
    help="upgrade-db: bring the billing database's schema to this version, keeping its rows; "
    "without a command the service starts",
)
args = parser.parse_args()
if args.command == "upgrade-db":
    sys.exit(upgrade_db())

try:
    # the hub stops its managed services with a signal; that is a normal end, not a crash
    with contextlib.suppress(KeyboardInterrupt), exit_on_refusal("billing"):
        asyncio.run(main())
except (SchemaMismatch, KubeConfigMissing, BadCookieSecret) as e:
    # a refusal, not a crash: one line the operator can act on instead of a traceback
    logging.getLogger("billing").critical("%s", e)
    sys.exit(1)
