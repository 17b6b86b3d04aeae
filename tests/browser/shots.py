"""Screenshots for the README, taken by the Chromium tests that check those pages.

Every call takes the screenshot (a page that cannot be drawn fails the test); it is saved
only when GPUTAP_SCREENSHOTS names a folder: `make screenshots` sets it to docs/images.
"""

import os
from pathlib import Path


def screenshot(page, name: str, **options) -> bytes:
    """The page as PNG (``options`` as Playwright's), saved as ``name`` when asked."""
    folder = os.environ.get("GPUTAP_SCREENSHOTS")
    path = None
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        path = str(Path(folder) / name)
    image = page.screenshot(path=path, **options)
    assert len(image) > 10_000, f"{name}: the page drew almost nothing"
    return image
