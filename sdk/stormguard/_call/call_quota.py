"""The call's side of its key's quota (``_policies/quota``): before each attempt it
waits for its share of the key's rate (``pace``), each response's
``x-ratelimit-*`` headers tell the key's pacer what is left, and a quota 429 sends
the call back to the pacer instead of spending a retry (``_call/retry_loop.py``).

A call whose key has sent no quota signal yet pays a dict look-up, and, when its
answer carries no headers, a tally of its cost (``QuotaRegistry.unpaced``: the
first 429 of a provider without headers starts from it): no ``CallQuota`` is made
until the key is paced, or its first answer carries the headers. With a Redis URL
(``QuotaPolicy.redis_url``) a key is paced from its first call: another process may
know its limit. A reservation in Redis is
I/O, which the call flow yields (``SharedAsk``) and its driver performs; its answer
comes back through ``answered``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from .._core.exceptions import APIStatusError
from .._core.rate_limit_headers import NO_RATE_LIMIT
from .._core.verdict import (
    is_out_of_quota,
    is_quota_refusal,
    is_too_large_for_quota,
    refusal_message,
)
from .._policies.quota import (
    CREDENTIAL_HEADERS,
    CallQuota,
    Pace,
    QuotaKey,
    SharedAsk,
    estimate_cost,
    output_tokens,
    prompt_estimate,
    refusal_of,
)
from .call_base import CallBase

if TYPE_CHECKING:
    from .._policies.quota import QuotaGate
    from .._policies.quota._bucket import Reply

__all__ = [
    "answered_key",
    "credential",
    "current_key",
    "left_pacing",
    "pace_key",
    "quota_cost",
    "quota_counted",
    "quota_learns",
    "quota_observed",
    "quota_refused",
    "quota_sent",
]

#: Models whose key a client keeps at hand (past them, it starts again).
_MAX_MODELS = 256


def pace_key(call: CallBase) -> Pace | SharedAsk | None:
    """Before an attempt: None, go now; a ``SharedAsk``, the I/O to do first (its
    answer to ``answered``); else sleep ``seconds``, then send (``granted``) or
    ask again. Raises ``QuotaWaitError`` when the call's deadline cannot be met
    even at the whole key's rate."""
    quota = call._quota
    if quota is None:
        gate, key = call.core.quota, current_key(call)
        if gate is None or key is None:
            return None
        if gate.registry.get(key) is None:
            if not gate.shared or not gate.registry.shared_known(key):
                return None  # the key is not paced: nothing to wait for
            gate.registry.activate(key)
        quota = call._quota = gate.call(key, call.priority.rank)
    elif quota.state() is None:
        return None
    call.machine.step("pace")
    return quota.pace(quota_cost(call), call.core.clock.now(), call.deadline.at)


def answered_key(
    call: CallBase, ask: SharedAsk, reply: Reply | BaseException
) -> Pace | SharedAsk | None:
    """The answer to the ``SharedAsk`` ``pace`` returned (a Redis reply, or the
    error that stood for it): as ``pace``'s."""
    assert call._quota is not None
    return call._quota.answered(ask, reply, call.core.clock.now())


def left_pacing(call: CallBase) -> None:
    """The attempt ended before it was sent (refused, cancelled): the call's place
    and any cost it was granted go back to the key."""
    if call._quota is not None:
        call._quota.leave()


def current_key(call: CallBase) -> QuotaKey | None:
    if call.core.tiered:
        return _deployment_key(call)
    key = call._quota_key
    if key is None:
        key = call._quota_key = _client_key(call)
    return key


def _client_key(call: CallBase) -> QuotaKey | None:
    """The key of an attempt with the client's (or the call's) credential."""
    core, spec = call.core, call.spec
    gate, model = core.quota, spec.model
    if gate is None or model is None or spec.method != "POST":
        return None
    if spec.headers or spec.absolute_url is not None:
        return gate.key_for(credential(call), _host(call), model)
    # The client's own credential and service: one key per model.
    key = core.quota_keys.get(model)
    if key is None:
        key = gate.key_for(credential(call), _host(call), model)
        if len(core.quota_keys) >= _MAX_MODELS:
            core.quota_keys.clear()
        core.quota_keys[model] = key
    return key


def _deployment_key(call: CallBase) -> QuotaKey | None:
    """The key of the deployment the attempt goes to (in flight, or chosen for
    the next attempt): its credential, its host, its name for the model. When
    the call moves to another deployment, its place in the last key's quota is
    given back and the next key's taken."""
    target = call._endpoint or call._next_target or call._endpoint_choice
    provider = None if target is None else target.provider
    if provider is None or call.spec.absolute_url is not None:
        key = _client_key(call)
    else:
        gate, model = call.core.quota, call.spec.model
        if gate is None or model is None or call.spec.method != "POST":
            return None
        key = gate.key_for(provider.credential(), provider.host, provider.model_for(model))
    if key is not call._quota_key:
        left_pacing(call)
        call._quota = call._quota_cost = None
        call._quota_key = key
    return key


def credential(call: CallBase) -> str | None:
    """The credential the call sends: its own header before the client's."""
    for name, value in call.spec.headers.items():
        if name.lower() in CREDENTIAL_HEADERS:
            return value
    headers = call.core.headers
    for name in CREDENTIAL_HEADERS:
        given = headers.get(name)
        if given is not None:
            return given
    return None


def _host(call: CallBase) -> str:
    url = call.spec.absolute_url
    if url is None:
        return call.core.quota_host
    return url.partition("://")[2].partition("/")[0].rpartition("@")[2]


def quota_cost(call: CallBase) -> float:
    """What the provider charges the call when it admits it (``estimate_cost``,
    with the key's correction of a prompt no pre-check counted)."""
    cost = call._quota_cost
    if cost is None:
        gate = call.core.quota
        check = call.precheck
        key = call._quota_key
        cost = call._quota_cost = estimate_cost(
            call.spec.body,
            call._content,
            embeddings=call.spec.operation == "embeddings",
            default_output=gate.policy.default_output_tokens if gate is not None else 0,
            precheck=None if check is None else (check.prompt_tokens, check.max_tokens),
            prompt_scale=1.0 if gate is None or key is None else gate.prompt_scale(key),
        )
    return cost


def quota_counted(call: CallBase, usage: Mapping[str, object]) -> None:
    """An answer's ``usage``: the provider's count of the prompt corrects the key's
    estimate of the next calls' (``QuotaGate.calibrate``), and trues up what a
    shared bucket took for this one: it charged that count and the output."""
    prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
    if type(prompt) is int:
        _quota_calibrate(call, float(prompt))
        if call._quota is not None and call._quota_cost is not None:
            call._quota.charged(prompt + _quota_output(call))


def _quota_output(call: CallBase) -> float:
    """The output tokens the call's cost counts (``estimate_cost``'s)."""
    if call.spec.operation == "embeddings":
        return 0.0
    if call.precheck is not None:
        return float(call.precheck.max_tokens)
    gate = call.core.quota
    default = gate.policy.default_output_tokens if gate is not None else 0
    return float(output_tokens(call.spec.body, default))


def quota_learns(call: CallBase) -> bool:
    """Whether an answer's usage would correct the key's estimate (``_quota_calibrate``):
    the call is paced, or its answer came without headers; and no pre-check counted
    its prompt (that count is the provider's tokenizer's, not an estimate)."""
    return (
        call.core.quota is not None
        and (call._quota is not None or call.rate_limit is NO_RATE_LIMIT)
        and call.precheck is None
    )


def _quota_calibrate(call: CallBase, counted: float) -> None:
    """Correct the key's estimate by the provider's count: of a paced call, and of an
    answer without headers before its key is paced (its cost is tallied, and the
    calls a first 429 paces, here or in another process through a shared bucket,
    are charged by this estimate: learned before, they are not overcharged)."""
    gate, quota = call.core.quota, call._quota
    if gate is None or call.precheck is not None:
        return
    if quota is not None:
        key: QuotaKey | None = quota.key
    elif call.rate_limit is NO_RATE_LIMIT:
        key = current_key(call)
    else:
        return
    if key is not None:
        gate.calibrate(key, prompt_estimate(call._content), counted)


def _quota_call(call: CallBase, gate: QuotaGate) -> CallQuota | None:
    """The call's place in its key's quota, made now if it was not."""
    quota = call._quota
    if quota is None:
        key = current_key(call)
        if key is None:
            return None
        quota = call._quota = gate.call(key, call.priority.rank)
    return quota


def quota_sent(call: CallBase) -> None:
    if call._quota is not None:
        call._quota.sent()
        call._quota_refusal = False


def quota_observed(call: CallBase, status: int) -> None:
    """The response's ``x-ratelimit-*`` headers, for the key's pacer: a charged
    request (a success, or a 5xx the provider admitted) counts in this process's
    share; a refusal or a caller's error does not. An answer the provider did not
    charge (a 4xx; a 429 once ``quota_refused`` has judged it) gives back what a
    shared bucket took for it."""
    gate = call.core.quota
    if gate is None:
        return
    charged = status < 300 or status >= 500
    if call.rate_limit is NO_RATE_LIMIT:
        # No headers: the send counts in the key's share once a 429 has turned its
        # pacing on, and before, in what this process sent (the first 429 starts
        # from it: docs/quotas.md, "Without headers").
        if charged:
            if call._quota is not None:
                call._quota.observe(
                    call._started, call.core.clock.now(), NO_RATE_LIMIT, quota_cost(call)
                )
            else:
                key = current_key(call)
                if key is not None:
                    gate.registry.unpaced(
                        key, call._started, call.core.clock.now(), quota_cost(call)
                    )
    else:
        quota = _quota_call(call, gate)
        if quota is not None:
            quota.observe(
                call._started,
                call.core.clock.now(),
                call.rate_limit,
                quota_cost(call) if charged else 0.0,
            )
    if not charged and status != 429 and call._quota is not None:
        call._quota.charged(0.0, 0.0)


def quota_refused(call: CallBase, error: APIStatusError) -> bool:
    """Whether ``error`` is a quota 429 the key's pacer takes (the call then goes
    back to it): a quota's own 429 (``is_quota_refusal``), or any 429 without a
    server's shed marker once the key is paced. Its wait is set on the key."""
    gate = call.core.quota
    if gate is None or error.status_code != 429:
        return False
    if not is_quota_refusal(error):
        paced = call._quota is not None and call._quota.state() is not None
        if error.server_load.load_shed is not None:
            return False  # the server's shed, after the quota charged it (server.md)
        if not paced or is_out_of_quota(error) or is_too_large_for_quota(error):
            if call._quota is not None:
                call._quota.charged(0.0, 0.0)  # refused, and not by the rate: nothing
            return False
    quota = _quota_call(call, gate)
    if quota is None:
        return False
    message = refusal_message(error)
    quota.refused(
        call._started,
        call.core.clock.now(),
        message,
        error.server_load.retry_after,
        error.rate_limit,
    )
    requested = refusal_of(message).requested  # "Requested N": prompt + max_tokens
    if requested is not None and call.spec.operation != "embeddings":
        output = output_tokens(call.spec.body, gate.policy.default_output_tokens)
        _quota_calibrate(call, float(requested - output))
    return True
