"""The quota scenario's arithmetic and its variants: the ideal wall time, the server's
flags of a variant, the default matrix and the flags' cross product."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest

from stormguard_drill.quota.config import (
    QuotaVariant,
    cross_variants,
    default_variants,
    quota_preset,
    server_args,
)


def test_ideal_is_the_tokens_beyond_the_bucket_at_the_refill_rate_plus_one_answer() -> None:
    workload = quota_preset("full").workload
    # 94,500 tokens on 60,000 TPM: 34,500 tokens beyond the bucket at 1,000 a second.
    assert workload.ideal_wall_s(QuotaVariant(processes=4), 94_500) == pytest.approx(35.0)
    # Within the bucket, the workers' answers bound it: 300 calls, 32 workers, 10 rounds.
    assert workload.ideal_wall_s(QuotaVariant(processes=4), 50_000) == pytest.approx(5.0)


def test_an_rpm_bound_ideal_counts_requests_not_tokens() -> None:
    workload = quota_preset("full").workload
    variant = QuotaVariant(processes=4, bound="rpm")
    # 300 calls on 180 RPM: 120 beyond the bucket at 3 a second; the TPM never binds.
    assert workload.ideal_wall_s(variant, 94_500) == pytest.approx(40.5)


def test_one_worker_is_bound_by_its_own_answers() -> None:
    workload = replace(quota_preset("full").workload, workers=1)
    assert workload.ideal_wall_s(QuotaVariant(processes=1), 94_500) == pytest.approx(150.0)


def test_a_variant_is_the_servers_quota_flags() -> None:
    workload = quota_preset("full").workload
    assert server_args(workload, QuotaVariant(processes=4)) == (
        *("--quota-tpm", "60000", "--quota-rpm", "3000", "--quota-retry-after", "seconds"),
    )
    assert server_args(
        workload, QuotaVariant(processes=1, bound="rpm", retry_after="none", headers=False)
    ) == (
        *("--quota-tpm", "1000000", "--quota-rpm", "180", "--quota-retry-after", "none"),
        "--no-quota-headers",
    )


def test_the_default_matrix_changes_one_thing_of_the_base_at_a_time() -> None:
    base, *others = default_variants("full")
    assert base == QuotaVariant(processes=4, bound="tpm", retry_after="seconds", headers=True)
    changed = [
        {f.name for f in fields(QuotaVariant) if getattr(v, f.name) != getattr(base, f.name)}
        for v in others
    ]
    assert changed == [{"processes"}, {"processes"}, {"retry_after"}, {"headers"}, {"bound"}]
    assert {v.processes for v in others} >= {1, 16}
    assert len({v.name for v in default_variants("full")}) == 6  # names tell them apart
    assert default_variants("quick") == (QuotaVariant(processes=2),)


def test_flags_ask_for_every_combination_of_their_values() -> None:
    variants = cross_variants("full", (1, 16), ("tpm", "rpm"), None, (True, False))
    assert len(variants) == 8
    assert {v.retry_after for v in variants} == {"seconds"}  # the base's
    assert {(v.processes, v.bound, v.headers) for v in variants} == {
        (p, b, h) for p in (1, 16) for b in ("tpm", "rpm") for h in (True, False)
    }


@pytest.mark.parametrize("mode", ["full", "quick", "tiny"])
def test_every_size_asks_for_more_than_its_bucket(mode: str) -> None:
    # ~315 tokens a call (checked at the server by the drill's end-to-end test): the
    # quota binds for a while, not for a whole minute.
    workload = quota_preset(mode).workload  # type: ignore[arg-type]
    demand = workload.calls * 315
    assert 1.03 < demand / workload.tpm_bound.tpm < 1.7
    assert 1.1 < workload.calls / workload.rpm_bound.rpm < 1.8
    assert workload.rpm_bound.tpm > 2 * demand  # the other limit never binds
    assert workload.tpm_bound.rpm > 5 * workload.calls
