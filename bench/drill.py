"""Launcher for the drill from a checkout: ``.venv/bin/python bench/drill.py [--quick]``.

The drill itself is the ``stormguard_drill`` package beside this file (installed with
the distribution, so ``stormguard-drill`` and ``python -m stormguard_drill`` work from
any install with the ``bench`` extra); this file only runs it. See docs/benchmarks.md.
"""

from stormguard_drill.cli import main

if __name__ == "__main__":
    main()
