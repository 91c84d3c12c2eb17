"""``stormguard-server``: run the reference server from the command line.

Every flag maps to one field of the config dataclasses (``stormguard_server.config``);
``--help`` explains each. The flags are declared in ``cli.flags``, turned into a
``ServerConfig`` (and checked across each other) in ``cli.config``, and the servers
run in ``serving.py``; ``main`` ties them together. The admin
endpoint, when asked for, is a second uvicorn server bound to 127.0.0.1 only,
behind a bearer token (``--admin-token``, else ``$STORMGUARD_ADMIN_TOKEN``,
else a random one logged once at start).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

from stormguard_server.cli.config import (
    admin_token_from_env,
    check_http_limits,
    config_from_args,
    priority_token_from_env,
    shared_engine_flags,
)
from stormguard_server.cli.flags import build_parser
from stormguard_server.cli.quota import check_quota_flags
from stormguard_server.serving import serve
from stormguard_server.telemetry.logs import configure_logging

__all__ = ["build_parser", "config_from_args", "main", "serve"]


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    check_http_limits(parser, args)
    check_quota_flags(parser, args)
    admin_token_from_env(parser, args)
    priority_token_from_env(parser, args)
    if args.engine == "vllm":
        from stormguard_server.vllm.launch import launch

        config = config_from_args(args)
        launch(
            model=args.model,
            host=config.host,
            port=config.port,
            admission=config.admission,
            priority_trust=config.priority_trust,
            extra_args=[*shared_engine_flags(args, argv), *rest],
        )
        return
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    configure_logging(args.log_level, args.log_format)
    # uvicorn stops gracefully on Ctrl-C, then raises the signal again once the
    # servers are down: that is the end of the run, not an error to print.
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(config_from_args(args)))


if __name__ == "__main__":
    main()
