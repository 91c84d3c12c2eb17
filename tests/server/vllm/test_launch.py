"""The environment ``stormguard-server --engine vllm`` gives vLLM (no vLLM needed)."""

from __future__ import annotations

import json

from stormguard_server.config import AdmissionConfig, PriorityTrustConfig
from stormguard_server.guards.priority_trust import PriorityTrust
from stormguard_server.vllm.launch import vllm_command, vllm_environment
from stormguard_server.vllm.middleware import ENV_ADMISSION, admission_config_from_env


def test_offline_and_admission_settings_as_json() -> None:
    config = AdmissionConfig(max_queue_requests=6)
    env = vllm_environment(config, {"PATH": "/bin"})
    assert env["HF_HUB_OFFLINE"] == "1" and env["VLLM_NO_USAGE_STATS"] == "1"
    assert env["PATH"] == "/bin"
    assert admission_config_from_env(env) == config
    assert json.loads(env[ENV_ADMISSION])["max_queue_requests"] == 6


def test_the_users_own_settings_are_kept() -> None:
    env = vllm_environment(AdmissionConfig(), {"HF_HUB_OFFLINE": "0"})
    assert env["HF_HUB_OFFLINE"] == "0"


def test_command_puts_the_middleware_in_front_only_with_admission() -> None:
    on = vllm_command(model="m", host="127.0.0.1", port=8000, extra_args=["--enforce-eager"])
    assert on[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert on[on.index("--middleware") + 1].endswith("StormguardAdmission")
    assert on[-1] == "--enforce-eager"
    off = vllm_command(model="m", host="127.0.0.1", port=8000, extra_args=[], admission=False)
    assert "--middleware" not in off


def test_a_setting_written_under_its_earlier_name_is_read() -> None:
    env = {ENV_ADMISSION: json.dumps({"drain_window_s": 7.5})}
    assert admission_config_from_env(env).drain_period_s == 7.5


def test_whose_priority_to_believe_reaches_the_middleware() -> None:
    default = vllm_environment(AdmissionConfig(), {})
    assert default["STORMGUARD_TRUST_PRIORITY_FROM"] == "127.0.0.0/8,::1/128"
    assert "STORMGUARD_PRIORITY_TOKEN" not in default
    assert default["FORWARDED_ALLOW_IPS"] == ""  # uvicorn then believes no proxy
    trust = PriorityTrustConfig(
        networks=(), token="a-token-of-16-chars", forwarded_from=("10.9.0.1/32",)
    )
    env = vllm_environment(AdmissionConfig(), {}, priority_trust=trust)
    assert env["STORMGUARD_TRUST_PRIORITY_FROM"] == "none"
    assert env["STORMGUARD_PRIORITY_TOKEN"] == "a-token-of-16-chars"
    assert env["FORWARDED_ALLOW_IPS"] == "10.9.0.1/32"
    read = PriorityTrust.from_env(env)
    assert read.networks == () and read.trusts_address("127.0.0.1") is False
    assert PriorityTrust.from_env({}).trusts_address("127.0.0.1")


def test_a_bad_setting_stops_the_middleware_naming_its_variable() -> None:
    import pytest

    with pytest.raises(ValueError, match="STORMGUARD_TRUST_PRIORITY_FROM: not a network: 'x'"):
        PriorityTrust.from_env({"STORMGUARD_TRUST_PRIORITY_FROM": "10.0.0.0/8,x"})
    with pytest.raises(ValueError, match="STORMGUARD_PRIORITY_TOKEN: a priority token") as caught:
        PriorityTrust.from_env({"STORMGUARD_PRIORITY_TOKEN": "s3cr3t"})
    assert "s3cr3t" not in str(caught.value)
    assert PriorityTrust.from_env({"STORMGUARD_TRUST_PRIORITY_FROM": "none"}).networks == ()
