"""Price books on the database: versions as stored (exact JSON), the version in force at a
time, publishing a new one."""

from __future__ import annotations

import functools
import json
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ..domain.pricing import PriceBook, make_price_book
from ..domain.records import PriceBookRecord, Saved
from ..orm import PriceBookVersion
from .operations import reads, writes


def book_json(book: PriceBook) -> str:
    """A price book as stored: exact decimal strings, sorted, so equal books compare equal."""
    return json.dumps(
        {
            "prices": book.configured_credits(),
            "spot_discount_percent": book.spot_discount_percent,
            "shared_percent": book.shared_percent,
        },
        sort_keys=True,
    )


# parsed once per text: every admission and session start prices through a stored version
@functools.lru_cache(maxsize=256)
def book_from_json(text: str) -> PriceBook:
    """A stored price book (:func:`book_json`) as a :class:`PriceBook`."""
    data = json.loads(text)
    return make_price_book(data["prices"], data["spot_discount_percent"], data["shared_percent"])


def book_record(db: Session, version: int | None) -> PriceBookRecord | None:
    """The published ``version``; None for None."""
    if version is None:
        return None
    row = db.get(PriceBookVersion, version)
    return PriceBookRecord(
        version=row.version,
        created_at=row.created_at,
        created_by=row.created_by,
        source=row.source,
        book=book_from_json(row.book),
    )


def book_at(
    db: Session, when: datetime | None, settings_book: PriceBook
) -> tuple[int | None, PriceBook]:
    """The version in force at ``when`` (now when None): the newest published by then.

    Before any version is recorded, ``settings_book`` (version None)."""
    query = select(func.max(PriceBookVersion.version))
    if when is not None:
        query = query.where(PriceBookVersion.created_at <= when)
    version = db.scalar(query)
    if version is None and when is not None:  # a start before the first version
        version = db.scalar(select(func.min(PriceBookVersion.version)))
    record = book_record(db, version)
    if record is None:
        return None, settings_book
    return record.version, record.book


@reads
def price_books(db: Session) -> list[PriceBookRecord]:
    """Every published version, newest first."""
    versions = db.scalars(
        select(PriceBookVersion.version).order_by(PriceBookVersion.version.desc())
    ).all()
    return [book_record(db, v) for v in versions]


@writes(name="publish_price_book")
def publish(
    db: Session, book: PriceBook, created_by: str, source: str, now: datetime
) -> Saved[PriceBookRecord]:
    """Record ``book`` as the newest version unless it equals the newest one already (False)."""
    text = book_json(book)
    latest = db.scalar(select(PriceBookVersion).order_by(PriceBookVersion.version.desc()).limit(1))
    if latest is not None and latest.book == text:
        return book_record(db, latest.version), False
    version = (latest.version + 1) if latest is not None else 1
    db.add(
        PriceBookVersion(
            version=version,
            created_at=max(now, latest.created_at) if latest else now,
            created_by=created_by,
            source=source,
            book=text,
        )
    )
    db.flush()
    return book_record(db, version), True


def last_settings_book(db: Session) -> str | None:
    """The stored text of the newest version the settings published, if any."""
    return db.scalar(
        select(PriceBookVersion.book)
        .where(PriceBookVersion.source == "settings")
        .order_by(PriceBookVersion.version.desc())
        .limit(1)
    )
