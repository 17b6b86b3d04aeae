"""Database rows as the domain's frozen records, detached from the session that read them."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import fields
from datetime import datetime
from typing import Any

from ..domain.courses import CourseRecord, CourseRules
from ..domain.pod_facts import MeteredSession
from ..domain.records import HoldRecord, SessionRecord
from ..orm import BillingSession, Course, Hold, SessionPod

# the columns named like the records' fields, looked up once: enforcement converts every
# open session every few seconds
_SESSION_FIELDS = tuple(f.name for f in fields(SessionRecord))
_HOLD_FIELDS = tuple(f.name for f in fields(HoldRecord) if f.name != "username")
_COURSE_FIELDS = tuple(
    f.name for f in fields(CourseRecord) if f.name not in ("allowed", "instructors")
)
_RULE_FIELDS = tuple(f.name for f in fields(CourseRules) if f.name != "allowed")
#: a metered session's fields from its pod's row, the rest from its session's
_POD_FIELDS = tuple(f.name for f in fields(MeteredSession) if hasattr(SessionPod, f.name))
_METERED_FIELDS = tuple(f.name for f in fields(MeteredSession) if f.name not in _POD_FIELDS)


def _values(row: Any, names: tuple[str, ...]) -> dict[str, Any]:
    return {name: getattr(row, name) for name in names}


def session_record(row: Any) -> SessionRecord:
    """A ``sessions`` row (an ORM object or a Core row) as a record."""
    return SessionRecord(**_values(row, _SESSION_FIELDS))


def hold_record(row: Hold, username: str) -> HoldRecord:
    """A hold of ``username``'s account as a record."""
    return HoldRecord(username=username, **_values(row, _HOLD_FIELDS))


def new_course(
    rules: CourseRules, slug: str, join_code: str | None, created_by: str, now: datetime
) -> Course:
    """A new course of ``rules`` (``allowed`` is stored as a JSON list)."""
    return Course(
        slug=slug,
        allowed=json.dumps(list(rules.allowed)),
        join_code=join_code,
        created_by=created_by,
        created_at=now,
        **_values(rules, _RULE_FIELDS),
    )


def course_record(row: Course, instructors: Iterable[str]) -> CourseRecord:
    """A course with its instructors as a record (``allowed`` is stored as a JSON list)."""
    return CourseRecord(
        allowed=tuple(json.loads(row.allowed)),
        instructors=tuple(sorted(instructors)),
        **_values(row, _COURSE_FIELDS),
    )


def metered_session(pod: SessionPod, session: BillingSession) -> MeteredSession:
    """An open session bound to ``pod`` as the pod meter reads it."""
    return MeteredSession(**_values(pod, _POD_FIELDS), **_values(session, _METERED_FIELDS))
