"""Prefix-cache affinity: the endpoint a call's prompt prefix belongs to.

Calls that share a long prefix (a system prompt, a few-shot block, a
conversation's history, a document asked several questions) are far cheaper on
the replica that already holds that prefix in its KV cache: vLLM's automatic
prefix caching skips its prefill. A call's **affinity key** names its prefix
(``key_of``); the key's **ranking** of the endpoints is weighted rendezvous
(highest-random-weight) hashing, and the call goes to the first endpoint of the
ranking whose load stays within the **bound** of consistent hashing with bounded
loads (``affinity_choice``). No I/O and no lock here: the picker
(``_policies/routing/picker.py``) calls it under its own lock.

**Rendezvous hashing** (Thaler and Ravishankar): each endpoint scores
``-weight / ln(u)``, ``u`` uniform in (0, 1) from a keyed hash of its name, and
the highest score wins: an endpoint wins a share of the keys equal to its share
of the weights, and a change in the set (discovery adding or removing a replica)
moves only the keys of the endpoint that came or went. The hash is BLAKE2b, the
same in every process and on every run (Python's ``hash()`` of a string is
salted per process, so two clients, or one client restarted, would disagree).

**Bounded loads** (Mirrokni, Thorup and Zadimoghaddam, "Consistent Hashing with
Bounded Loads", 2018): an endpoint takes the call only while its attempts in
flight are below ``ceil((1 + epsilon) * (total in flight + 1) * its weight
share)``; past it the call walks on down the key's ranking. One hot key then
spills over onto its next endpoints instead of piling onto one replica, and no
endpoint ever holds more than ``1 + epsilon`` times its fair share of this
client's calls, rounded up to a whole call. The paper's trade-off: the bound is
``1 + epsilon`` times the average, and the calls an arrival or departure moves
grow as ``1/epsilon**2``, so a tighter bound moves calls off their home far more
often.
``epsilon = 0.25`` (``AffinityPolicy``'s default) is the factor the paper's
users settled on (HAProxy's ``hash-balance-factor 125``, written for Vimeo's
deployment of it; brpc's bounded-load balancer's default 1.25): a replica gets
at most a quarter over its share, the most one client should add to a replica
that is already the busiest. With few calls in flight the bound is coarse, and an
even load's chance swings cross it: at 6 calls over two endpoints, 18-32 % of a
chat's turns left their home on real vLLM (docs/benchmarks.md, "Prefix-cache
affinity on real vLLM"): the bound was 4 of 6, and an even split of the other 5
calls' keys puts 4 or 5 on one home 6 times in 32.

**Moves.** A key whose home was full when its call came moves with that call:
the picker remembers the endpoint it went to (``moved``) and ranks it first for
the key's later calls, the home's place, while it takes them within its bound.
That endpoint holds the key's newest prefix (a conversation's history through the
turn that moved); the home holds an older one, and a turn sent back to it pays
the turns it missed. And the load that piled up on one replica drains off by
keys that move and stay, each paying its prefix on the other replica once,
instead of by one call after another of many keys, each paying its whole prefix
there and coming back. A home passed over only while it sheds, is out of rotation
or was tried by the call keeps its key: that is brief, and its cache is intact.
The memory is the client's own (another process's client keeps its own), and
bounded (``picker.MOVED_KEYS``, the least recently moved forgotten first: a key
forgotten goes home).

**Slack** (``slack``, whole calls): an endpoint also takes the call while it holds
fewer than its fair share plus ``slack``, whichever bound is larger. Gateways that
route on prefixes add the same absolute margin to a relative one, for the same
reason: SGLang's router leaves cache-aware routing only when the load is
imbalanced by both measures (``max - min > --balance-abs-threshold`` and ``max >
--balance-rel-threshold * min``; 32 and 1.1 in its library's defaults, counted in
the server's requests), and Ray Serve's prefix-aware router when the queue lengths
differ by more than ``imbalanced_threshold``. Over two endpoints, "fair share
plus ``slack``" is SGLang's ``max - min`` of ``2 * slack``. ``slack = 2``: at 6
calls in flight over two endpoints the bound is 5, and a key leaves its home only
when all 5 others are there too (1 time in 32 by an even split, against 6); up to 5
in flight, never; from about ``2 * slack /
epsilon`` calls in flight over two endpoints (16) the relative bound is the larger
and the paper's ``1 + epsilon`` holds, so that one hot key still spills over when
the client is busy. Two calls above an even share is little to a vLLM replica,
which batches up to 256 sequences by default.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .endpoint_state import EndpointState

__all__ = [
    "DEFAULT_EPSILON",
    "DEFAULT_PREFIX_CHARS",
    "DEFAULT_SLACK",
    "affinity_choice",
    "key_of",
    "load_bound",
    "ranking",
    "short_hash",
]

#: How far over its fair share of this client's calls in flight an endpoint may go
#: before a call walks on to the key's next endpoint (``AffinityPolicy.epsilon``).
DEFAULT_EPSILON = 0.25
#: Calls in flight an endpoint may hold above its fair share of this client's, however
#: few are in flight, before a key's calls move on (``AffinityPolicy.slack``).
DEFAULT_SLACK = 2
#: How much of a prompt a derived key reads: 16,384 characters, the horizon of the
#: Gateway API Inference Extension's prefix-cache scorer (256 blocks of 16 tokens at
#: about 4 characters a token), past which two prompts that share their start count
#: as one prefix. A document longer than this asked several questions is one key.
DEFAULT_PREFIX_CHARS = 16_384

#: 2**-52: ``u = (h + 0.5) * 2**-52`` of a 52-bit hash is exact and never 0 or 1.
_UNIT = 2.0**-52
#: What the caller's key and a derived one are hashed under: never the same key.
_GIVEN, _DERIVED = b"prompt_cache_key\x00", b"prefix\x00"


def key_of(body: Mapping[str, Any] | None, *, derive: bool, prefix_chars: int) -> bytes | None:
    """The call's affinity key (a 16-byte digest), or None: the body's
    ``prompt_cache_key`` when it has one (OpenAI's name for exactly this routing
    hint); else, with ``derive``, the leading part of its prompt (``prefix_material``).
    Never raises: a body it cannot read has no key, and the call goes by load."""
    if body is None:
        return None
    try:
        given = body.get("prompt_cache_key")
        if isinstance(given, str) and given:
            return _digest(_GIVEN, given[:prefix_chars])
        if not derive:
            return None
        material = prefix_material(body, prefix_chars)
    except Exception:  # a routing hint never fails a call: hostile input has no key
        return None
    return None if material is None else _digest(_DERIVED, material)


def prefix_material(body: Mapping[str, Any], prefix_chars: int) -> str | None:
    """The leading part of the prompt, canonical and at most ``prefix_chars`` long:
    of chat ``messages``, those from the start through the first user message (the
    system prompt, a few-shot block and the conversation's opening, which every
    later turn of the conversation repeats); of a completion's ``prompt`` and of the
    Responses API's ``instructions`` and ``input``, their start. None: no prompt."""
    messages = body.get("messages")
    if isinstance(messages, Sequence) and not isinstance(messages, (str, bytes)):
        lead: list[Any] = []
        for message in messages:
            lead.append(message)
            if isinstance(message, Mapping) and message.get("role") == "user":
                break
            if len(lead) >= prefix_chars:  # each message is at least one character
                break
        value: Any = lead
    elif "prompt" in body:
        value = body["prompt"]
    elif "input" in body:
        value = [body.get("instructions"), body["input"]]
    else:
        return None
    if not value:
        return None
    if isinstance(value, str):
        return value[:prefix_chars]
    # Strings cut, lists shortened and nesting bounded first: the canonical form's
    # first ``prefix_chars`` characters are the same, at a cost bounded by them.
    text = json.dumps(
        _bounded(value, prefix_chars, 0),
        sort_keys=True,
        ensure_ascii=False,
        separators=(",", ":"),
    )
    return text[:prefix_chars]


def _bounded(value: Any, room: int, depth: int) -> Any:
    """``value`` with each string cut to ``room`` characters and each list to its
    first ``room`` items; what JSON cannot hold, or nesting past 32 levels, raises
    (the caller's ``key_of`` then gives no key)."""
    if depth > 32:
        raise ValueError("nested too deep for an affinity key")
    if isinstance(value, str):
        return value[:room]
    if isinstance(value, Mapping):
        return {str(k): _bounded(v, room, depth + 1) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        return [_bounded(item, room, depth + 1) for item in list(value[:room])]
    if value is None or isinstance(value, (bool, int, float)):
        return value
    raise TypeError(f"{type(value).__name__} has no canonical form")


def _digest(domain: bytes, text: str) -> bytes:
    data = domain + text.encode("utf-8", "surrogatepass")
    return hashlib.blake2b(data, digest_size=16).digest()


def short_hash(key: bytes) -> str:
    """A short, stable name of a key for logs and tests (never the prompt)."""
    return key[:4].hex()


def _ranked(key: bytes, states: Sequence[EndpointState]) -> list[tuple[float, str, int]]:
    """``(-score, name, index)`` of each of ``states``: sorted, the key's ranking.
    The score is weighted rendezvous hashing's ``-weight / ln(u)`` (higher wins),
    ``u`` from BLAKE2b keyed with ``key`` over the endpoint's name; the name breaks a
    tie, so every process ranks alike."""
    keyed = hashlib.blake2b(digest_size=8, key=key)  # copied per name: cheaper than a new key
    ranked = []
    for index, state in enumerate(states):
        hasher = keyed.copy()
        hasher.update(state.name.encode("utf-8", "surrogatepass"))
        u = ((int.from_bytes(hasher.digest(), "big") >> 12) + 0.5) * _UNIT
        ranked.append((state.weight / math.log(u), state.name, index))
    return ranked


def ranking(key: bytes, states: Sequence[EndpointState]) -> list[EndpointState]:
    """``states`` in the key's order of preference (its home first)."""
    return [states[index] for _, _, index in sorted(_ranked(key, states))]


def load_bound(total_in_flight: int, weight_share: float, epsilon: float, slack: int = 0) -> int:
    """The attempts in flight an endpoint may hold before it takes one more: its fair
    share ``(total + 1) * share`` (the ``+ 1`` is the call being placed) times ``1 +
    epsilon``, or plus ``slack``, whichever is larger, rounded up (to 9 places
    first, so that 1.25 * 4 * 0.25 is 1.25, not above)."""
    fair = (total_in_flight + 1) * weight_share
    return math.ceil(round(max((1.0 + epsilon) * fair, fair + slack), 9))


def affinity_choice(
    key: bytes,
    states: Sequence[EndpointState],
    *,
    epsilon: float,
    skip: Callable[[EndpointState], bool],
    slack: int = 0,
    moved: str | None = None,
) -> tuple[EndpointState, EndpointState | None]:
    """The key's home among ``states``, and the endpoint the call goes to: the first
    of the home and then the key's ranking not ``skip``-ped (shedding, tried by this
    call) whose attempts in flight are below its ``load_bound``. The home is the
    endpoint named ``moved`` when it is among ``states`` (the key moved there when
    its home was full: ``EndpointPicker``), else the first of the ranking. None:
    none fits, and the caller orders ``states`` by load instead."""
    scored = _ranked(key, states)
    total = sum(s.in_flight for s in states)
    weights = sum(s.weight for s in states)

    def fits(state: EndpointState) -> bool:
        if skip(state):
            return False
        return state.in_flight < load_bound(total, state.weight / weights, epsilon, slack)

    home = states[min(scored)[2]]
    if moved is not None and moved != home.name:
        home = next((s for s in states if s.name == moved), home)
    if fits(home):  # most calls: their home, found without sorting
        return home, home
    for _, _, index in sorted(scored):
        if states[index] is not home and fits(states[index]):
            return home, states[index]
    return home, None
