"""Launcher for the drill from a checkout: ``.venv/bin/python bench/drill.py [--quick]``.

The drill itself lives in ``stormguard_server.drill`` (installed with the package, so
the ``stormguard-drill`` console script works from any install with the ``bench``
extra); this file only runs it. See docs/benchmarks.md.
"""

from stormguard_server.drill.cli import main

if __name__ == "__main__":
    main()
