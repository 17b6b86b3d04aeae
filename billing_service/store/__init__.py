"""The billing database's side: :class:`Store`, the one object callers use, and the section
modules of plain functions of a database session it delegates to."""

from .facade import Store

__all__ = ["Store"]
