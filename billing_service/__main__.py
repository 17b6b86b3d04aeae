import asyncio
import contextlib

from .app import main

# the hub stops its managed services with a signal; that is a normal end, not a crash
with contextlib.suppress(KeyboardInterrupt):
    asyncio.run(main())
