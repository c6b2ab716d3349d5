"""Bucket policies: pure functions of (max, policy); padding-waste and graph-count bounds."""

import pytest

from mla_func.capture import BucketPolicy, bucket_sizes, pad_to, padding_waste


@pytest.mark.parametrize("top", [1, 7, 32, 100, 512, 8192])
def test_default_policy_bounds_waste_and_count(top):
    sizes = bucket_sizes(top)
    assert list(sizes) == sorted(set(sizes)) and sizes[0] == 1 and sizes[-1] == top
    assert padding_waste(sizes, above=32) <= 0.125
    for n in range(1, top + 1):
        b = pad_to(n, sizes)
        assert b >= n and (b - n) / n <= (0.125 if n > 32 else 1.0)
    assert pad_to(top + 1, sizes) is None


def test_counts_against_vllm_and_sglang():
    assert len(bucket_sizes(512)) == 39 and len(bucket_sizes(8192)) == 71
    assert len(bucket_sizes(512, "vllm")) == 51
    assert len(bucket_sizes(8192, "sglang")) == 58
    assert padding_waste(bucket_sizes(512, "vllm"), above=32) > 0.2
    assert bucket_sizes(8192, BucketPolicy(max_waste=0.25))[-1] == 8192
    assert len(bucket_sizes(8192, BucketPolicy(max_waste=0.25))) < 71
