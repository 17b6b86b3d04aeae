"""How gputap writes hours left (course hours, what credit lasts), one rule everywhere: the
spawn form, Lab, the billing page and the courses page say the same figure at the same
moment."""

from __future__ import annotations


def format_hours(hours: float) -> str:
    """4.5 h, 12 h, 0.3 h: one decimal below ten hours, floored so it never promises more."""
    if hours >= 10:
        return f"{int(hours)} h"
    return f"{int(hours * 10) / 10:g} h"
