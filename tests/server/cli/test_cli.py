"""The CLI: every flag is explained and lands in the config."""

from __future__ import annotations

import re

import pytest

from stormguard_server.cli import build_parser, config_from_args
from stormguard_server.config import ServerConfig


def test_every_flag_has_help() -> None:
    parser = build_parser()
    for action in parser._actions:
        if action.dest in {"help", "version"}:
            continue
        assert action.help and len(action.help) > 8, action.option_strings


def test_help_mentions_the_main_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    out = capsys.readouterr().out
    for flag in ("--admission", "--num-kv-blocks", "--restart-s", "--admin-port", "--oom"):
        assert flag in out
    assert re.search(r"--host HOST\s+address to listen on \(default: 127\.0\.0\.1\)", out)


def test_defaults_match_the_config_dataclasses() -> None:
    config = config_from_args(build_parser().parse_args([]))
    assert config == ServerConfig()


def test_flags_map_to_fields() -> None:
    args = build_parser().parse_args(
        [
            "--admission", "off", "--no-oom", "--num-kv-blocks", "64", "--step-base-ms", "2",
            "--max-queue-requests", "5", "--min-retry-after-ms", "100", "--error-rate", "0.5",
            "--hang-rate", "0.25", "--model-alias", "small", "--admin-port", "9999",
        ]
    )  # fmt: skip
    config = config_from_args(args)
    assert config.admission.enabled is False
    assert config.engine.oom_crash is False
    assert config.engine.num_kv_blocks == 64
    assert config.engine.step_base_s == 0.002
    assert config.admission.max_queue_requests == 5
    assert config.admission.min_retry_after_s == 0.1
    assert config.faults.error_rate == 0.5
    assert config.faults.hang_rate == 0.25
    assert config.model_aliases == ("small",)
    assert config.admin_port == 9999


@pytest.mark.parametrize(
    "argv",
    [
        ["--num-kv-blocks", "0"],
        ["--kv-watermark", "1.5"],
        ["--restart-s", "-1"],
        ["--restart-s", "nan"],
        ["--port", "70000"],
        ["--admission", "maybe"],
    ],
)
def test_nonsense_flags_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(argv)


def test_console_script_is_installed_and_runs() -> None:
    import subprocess
    import sys
    from pathlib import Path

    script = Path(sys.executable).parent / "stormguard-server"
    done = subprocess.run([str(script), "--version"], capture_output=True, text=True, check=True)
    assert done.stdout.startswith("stormguard-server ")


def test_slow_client_flags_map_to_fields() -> None:
    args = build_parser().parse_args(
        [
            "--header-timeout-s", "2.5", "--body-timeout-s", "7", "--max-connections", "300",
            "--max-concurrent-requests", "40", "--max-buffered-body-bytes", "5000000",
        ]
    )  # fmt: skip
    config = config_from_args(args)
    assert config.header_timeout_s == 2.5
    assert config.body_timeout_s == 7.0
    assert config.max_connections == 300
    assert config.max_concurrent_requests == 40
    assert config.max_buffered_body_bytes == 5_000_000


@pytest.mark.parametrize(
    "argv",
    [
        ["--header-timeout-s", "0"],
        ["--header-timeout-s", "-1"],
        ["--body-timeout-s", "nan"],
        ["--body-timeout-s", "inf"],
        ["--max-connections", "0"],
        ["--max-concurrent-requests", "-3"],
        ["--max-buffered-body-bytes", "0"],
    ],
)
def test_nonsense_slow_client_flags_are_refused(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(argv)
    assert argv[0] in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--max-body-bytes", "2000000", "--max-buffered-body-bytes", "1000000"],
            "--max-buffered-body-bytes must be at least --max-body-bytes",
        ),
        (
            ["--engine", "vllm", "--header-timeout-s", "5"],
            "--header-timeout-s needs --engine sim",
        ),
        (
            ["--engine", "vllm", "--max-header-count", "50"],
            "--max-header-count needs --engine sim",
        ),
        (["--engine", "vllm", "--port-file", "ports.json"], "--port-file needs --engine sim"),
    ],
)
def test_slow_client_flags_that_cannot_hold_are_refused(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from stormguard_server.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_head_and_priority_trust_flags_map_to_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STORMGUARD_PRIORITY_TOKEN", raising=False)
    args = build_parser().parse_args(
        [
            "--max-header-bytes", "32768", "--max-header-count", "50",
            "--trust-priority-from", "10.0.0.0/8, 192.168.1.7",
            "--trust-priority-from", "fd00::/8",
            "--priority-token", "a-token-of-16-chars",
            "--trust-forwarded-from", "10.9.0.1",
        ]
    )  # fmt: skip
    config = config_from_args(args)
    assert (config.max_header_bytes, config.max_header_count) == (32768, 50)
    trust = config.priority_trust
    assert trust.networks == ("10.0.0.0/8", "192.168.1.7/32", "fd00::/8")  # loopback replaced
    assert trust.token == "a-token-of-16-chars"
    assert trust.forwarded_from == ("10.9.0.1/32",)
    assert "a-token-of-16-chars" not in repr(config)


def test_by_default_loopback_is_trusted_and_no_proxy() -> None:
    trust = config_from_args(build_parser().parse_args([])).priority_trust
    assert trust.networks == ("127.0.0.0/8", "::1/128")
    assert (trust.token, trust.forwarded_from) == (None, ())
    none = config_from_args(build_parser().parse_args(["--trust-priority-from", "none"]))
    assert none.priority_trust.networks == ()


def test_help_explains_the_trust_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--trust-priority-from CIDRS" in out
    assert "(default: 127.0.0.0/8,::1/128)" in out
    assert "--priority-token TOKEN" in out and "--trust-forwarded-from CIDRS" in out
    assert "--max-header-bytes" in out and "(default: 16384)" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--trust-priority-from", "10.0.0.1/8"], "not a network: '10.0.0.1/8'"),
        (["--trust-priority-from", "10.0.0.0/8,example.com"], "not a network: 'example.com'"),
        (["--trust-forwarded-from", "300.1.1.1"], "not a network: '300.1.1.1'"),
        (["--priority-token", "s3cr3t"], "a priority token is at least 16"),
        (["--max-header-count", "0"], "--max-header-count"),
    ],
)
def test_a_bad_trust_flag_is_a_clear_startup_error(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from stormguard_server.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert "s3cr3t" not in err  # a token is never quoted


def test_the_priority_token_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from stormguard_server.cli.config import priority_token_from_env

    parser = build_parser()
    monkeypatch.setenv("STORMGUARD_PRIORITY_TOKEN", "from-the-environment")
    args = parser.parse_args([])
    priority_token_from_env(parser, args)
    assert config_from_args(args).priority_trust.token == "from-the-environment"
    args = parser.parse_args(["--priority-token", "from-the-command-line"])
    priority_token_from_env(parser, args)
    assert args.priority_token == "from-the-command-line"
