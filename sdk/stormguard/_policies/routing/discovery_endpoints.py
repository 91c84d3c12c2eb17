"""From a look's answers to the client's endpoints: which answers are kept as a
name's addresses, and the endpoint set the client's entries stand for now.

Each address of a name becomes an endpoint (``http://10.0.0.5:8000/v1``, named
``10.0.0.5:8000``; IPv6 bracketed) with the weight, models and classes of the
``Endpoint`` it came from, and keeps the service's name as its ``Host`` header
and, for https, as the name TLS checks.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace

from .dns_name import NameState
from .endpoint_config import Endpoint
from .endpoint_state import EndpointState

__all__ = ["compose_endpoints", "valid_addresses"]

#: Discovery's one logger (docs/discovery.md names it), wherever its code lives.
logger = logging.getLogger("stormguard._discovery")


def valid_addresses(name: NameState, found: Sequence[str], limit: int) -> list[str]:
    """The IP addresses among a look's answers, each once, in order, at most
    ``limit``: reading stops at the ``limit``-th, so a huge answer costs what the
    cap keeps, not what it holds (a list's ``in`` made 32,768 addresses 9 s of CPU)."""
    addresses: dict[str, None] = {}  # insertion order, and a set's look-up
    bad = read = 0
    for raw in found:
        read += 1
        try:
            text = str(ipaddress.ip_address(str(raw)))
        except ValueError:
            bad += 1
            continue
        addresses[text] = None
        if len(addresses) >= limit:
            break
    if bad:
        logger.warning("DNS discovery of %s: %d answers were not IP addresses", name.label, bad)
    if read < len(found):
        logger.warning(
            "DNS discovery of %s: %d answers, the first %d addresses kept (max_addresses)",
            name.label,
            len(found),
            limit,
        )
    return list(addresses)


def compose_endpoints(
    entries: Sequence[tuple[Endpoint, bool]], names: Mapping[int, NameState]
) -> list[EndpointState]:
    """The client's endpoints: each static entry as it is, each DNS entry (``names``,
    by the entry's position) as the addresses its last good look found."""
    states: list[EndpointState] = []
    seen: set[str] = set()
    for i, (endpoint, dns) in enumerate(entries):
        if not dns:
            state = EndpointState(endpoint)
            if state.name not in seen:
                seen.add(state.name)
                states.append(state)
            continue
        name = names[i]
        for address in name.addresses or ():
            label = name.endpoint_name(address)
            if label in seen:
                continue  # the same address under two names: the first one keeps it
            seen.add(label)
            url = name.url.copy_with(host=address)
            states.append(
                EndpointState(
                    replace(endpoint, base_url=str(url), name=label),
                    authority=name.authority,
                    server_hostname=name.host if name.scheme == "https" else None,
                )
            )
    return states
