"""The quota's flags: in --help, into the config, and a clear startup error for a
limit that makes no sense or a setting that cannot act."""

from __future__ import annotations

import pytest

from stormguard_server.cli import build_parser, config_from_args, main
from stormguard_server.config import QuotaConfig

FLAGS = (
    "--quota-tpm",
    "--quota-rpm",
    "--quota-daily-tokens",
    "--quota-default-max-tokens",
    "--quota-retry-after",
    "--quota-headers",
    "--no-quota-headers",
    "--quota-insufficient",
)


def test_every_quota_flag_is_in_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    out = capsys.readouterr().out
    for flag in FLAGS:
        assert flag in out
    assert "{none,seconds,ms,azure}" in out


def test_off_by_default() -> None:
    config = config_from_args(build_parser().parse_args([]))
    assert config.quota == QuotaConfig()
    assert not config.quota.enabled


def test_flags_land_in_the_config() -> None:
    args = build_parser().parse_args(
        [
            "--quota-tpm", "60_000", "--quota-rpm", "500", "--quota-daily-tokens", "1000000",
            "--quota-default-max-tokens", "0", "--quota-retry-after", "azure",
            "--no-quota-headers", "--quota-insufficient",
        ]
    )  # fmt: skip
    assert config_from_args(args).quota == QuotaConfig(
        tokens_per_minute=60_000,
        requests_per_minute=500,
        tokens_per_day=1_000_000,
        default_max_tokens=0,
        retry_after="azure",
        headers=False,
        insufficient_quota=True,
    )


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--quota-tpm", "0"], "must be within 1..1000000000000, got 0"),
        (["--quota-tpm", "-60000"], "must be within 1..1000000000000, got -60000"),
        (["--quota-rpm", "lots"], "must be a whole number, got 'lots'"),
        (["--quota-rpm", "1.5"], "must be a whole number, got '1.5'"),
        (["--quota-rpm", "1e3"], "must be a whole number, got '1e3'"),
        (["--quota-tpm", "inf"], "must be a whole number, got 'inf'"),
        (["--quota-tpm", ""], "must be a whole number, got ''"),
        (["--quota-daily-tokens", "1" + "0" * 13], "must be within 1..1000000000000"),
        (["--quota-tpm", "9" * 400], "must be within 1..1000000000000"),
        (["--quota-default-max-tokens", "-1"], "must be within 0..1000000000, got -1"),
        (["--quota-retry-after", "minutes"], "invalid choice: 'minutes'"),
    ],
)
def test_nonsense_is_refused_at_startup_saying_which_flag_and_why(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert argv[0] in err
    assert said in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--quota-retry-after", "ms"], "--quota-retry-after sets a quota that is off"),
        (["--no-quota-headers"], "--quota-headers sets a quota that is off"),
        (["--quota-default-max-tokens", "9"], "give --quota-tpm, --quota-rpm"),
        (["--engine", "vllm", "--quota-tpm", "1000"], "--quota-tpm needs --engine sim"),
        (["--engine", "vllm", "--quota-insufficient"], "--quota-insufficient needs --engine sim"),
    ],
)
def test_a_quota_setting_that_cannot_act_is_refused(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert said in capsys.readouterr().err
