"""The billing domain, pure and synchronous: money, prices, the ledger's arithmetic, courses,
admission decisions, the records the store answers with, and what a pod says about its session.

Nothing here touches a database, the network or the clock: callers pass ``now`` and the facts
they read. Modules here import the standard library, :mod:`gputap_common` and each other only
(never SQLAlchemy, tornado, or the store, handlers and loops built on them).
"""
