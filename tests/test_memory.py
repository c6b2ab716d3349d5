"""mla_func.memory: the room a device has for new tensors, asked before large allocations."""

import builtins

import pytest
import torch

from mla_func.memory import available_bytes, human


def test_host_reports_its_available_memory():
    free = available_bytes("cpu")
    assert isinstance(free, int) and 0 < free
    with open("/proc/meminfo") as f:  # the same figure the kernel reports, in kB
        total = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
    assert free <= total * 1024


def test_host_without_meminfo_falls_back_to_free_pages(monkeypatch):
    real_open = builtins.open

    def no_meminfo(path, *args, **kwargs):
        if path == "/proc/meminfo":
            raise FileNotFoundError(path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", no_meminfo)
    import os

    pages = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    got = available_bytes(torch.device("cpu"))
    assert got is not None and abs(got - pages) <= 64 * 2**20  # read a moment apart


def test_unknown_devices_have_no_bound():
    assert available_bytes("meta") is None


@pytest.mark.parametrize("n, text", [(0, "0 B"), (1023, "1023 B"), (1024, "1.00 KiB"),
                                     (3 * 2**29, "1.50 GiB"), (2**30 - 2**20, "1023.00 MiB"),
                                     (5 * 2**40, "5.00 TiB"), (2**52, "4096.00 TiB")])
def test_human_sizes(n, text):
    assert human(n) == text


def test_init_state_refuses_a_cache_past_the_room(monkeypatch):
    """The cache check asks the same function, and names both sizes."""
    import mla_func as mf
    import mla_func.state

    monkeypatch.setattr(mla_func.state, "available_bytes", lambda device: 1024)
    with pytest.raises(ValueError, match=r"needs 7\.50 KiB but cpu has 1\.00 KiB available"):
        mf.init_state(mf.MLAConfig.preset("tiny"), num_pages=4, page_size=4)
