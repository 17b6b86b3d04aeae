"""The web layer: one module per resource, each ending in its ``default_handlers`` (paths
relative to the service prefix), put together in order by :mod:`.routes`."""
