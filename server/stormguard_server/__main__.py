"""``python -m stormguard_server`` is ``stormguard-server``."""

from stormguard_server.cli import main

main()
