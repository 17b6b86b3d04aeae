"""What every part of gputap shares, and nothing else: the clock, names, label keys, scope
names, the money formatter, Kubernetes time parsing and list-and-watch, and the settings
(docs/architecture.md).

Neutral ground: the spawner, the billing service and the hub configuration import it, and it
imports none of them (docs/architecture.md), so billing never needs the spawner and vice versa.
"""
