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
    assert len(bucket_sizes(8192, BucketPolicy(max_waste=0.25))) < 71


@pytest.mark.parametrize("waste", [0.05, 0.1, 0.125, 0.2, 0.3, 0.5, 1.0])
@pytest.mark.parametrize("top", [100, 1000, 8192])
def test_max_waste_is_a_bound(waste, top):
    """Above dense_to no n is padded by more than max_waste (0.3 gave 35% when its step did not
    divide the octave and the octave's top was skipped)."""
    sizes = bucket_sizes(top, BucketPolicy(max_waste=waste))
    assert sizes[-1] == top and list(sizes) == sorted(set(sizes))
    assert padding_waste(sizes, above=32) <= waste
    assert len(bucket_sizes(8192, BucketPolicy(max_waste=waste))) <= len(
        bucket_sizes(8192, BucketPolicy(max_waste=waste / 2)))


def test_unknown_policies_are_refused():
    with pytest.raises(ValueError, match="unknown bucket policy 'vlm'"):
        bucket_sizes(512, "vlm")
    with pytest.raises(ValueError, match="max_waste"):
        bucket_sizes(512, BucketPolicy(max_waste=0.0))
    assert bucket_sizes(512, "bounded") == bucket_sizes(512)
