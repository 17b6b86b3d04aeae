"""The pod meter's own rows: which pod each metered session ran in (``session_pods``), and
the open sessions bound to a pod. Each call is its own transaction on ``engine``; the meter
runs them on the store's executor."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Engine, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from ..domain.pod_facts import MeteredSession, PodFacts
from ..domain.pricing import STORAGE
from ..orm import BillingSession, SessionPod
from .rows import metered_session


def bind_pod(engine: Engine, facts: PodFacts, now: datetime) -> None:
    """Record the pod of ``facts.session_id``; the first binding of a session stays."""
    try:
        with Session(engine) as db, db.begin():
            if db.get(SessionPod, facts.session_id) is None:
                db.add(
                    SessionPod(
                        session_id=facts.session_id,
                        namespace=facts.namespace,
                        pod_name=facts.pod_name,
                        pod_uid=facts.pod_uid,
                        created_at=now,
                    )
                )
    except IntegrityError:
        pass  # a concurrent writer bound it first


def open_metered_sessions(engine: Engine, namespace: str) -> list[MeteredSession]:
    """Open sessions bound to a pod in ``namespace`` (never a data disk's: no pod runs it)."""
    query = (
        select(SessionPod, BillingSession)
        .join(BillingSession, BillingSession.id == SessionPod.session_id)
        .where(
            BillingSession.ended_at.is_(None),
            SessionPod.namespace == namespace,
            BillingSession.price_class != STORAGE,
        )
        .order_by(BillingSession.started_at, BillingSession.id)
    )
    with Session(engine) as db:
        return [metered_session(pod, session) for pod, session in db.execute(query).all()]
