"""mindgrpo/memory/swap.py: the ledger's phases with a copied inference model and with the policy shared."""

from types import SimpleNamespace

import pytest

from mindgrpo.memory.swap import SwapManager


def params(*sizes):
    """Stand-ins for fp32 Parameters of `sizes` elements (the ledger reads shape and itemsize)."""
    return [SimpleNamespace(shape=(n,), itemsize=4) for n in sizes]


def ledger(shared):
    m = SwapManager(enabled=True, shared_inference=shared)
    m.register("policy", params(100, 20))  # 480 bytes
    m.register("inference", params(90) if shared else params(100, 20, 90))  # fused copies alone, or model + them
    m.register("reference", params(100, 20))
    m.register("grads", extra_bytes=480)
    m.register("optimizer", params(240))
    m.register("kv_cache", sizer=lambda: 64)
    return m


def resident(m):
    return sorted(n for n, g in m.groups.items() if g.resident)


@pytest.mark.parametrize("shared", [False, True])
def test_each_phase_holds_its_groups_and_generating_with_the_policy_holds_it(shared):
    m = ledger(shared)
    with m.phase("rollout"):
        assert resident(m) == (["inference", "kv_cache", "policy"] if shared else ["inference", "kv_cache"])
    with m.phase("reference"):
        assert resident(m) == ["reference"]
    with m.phase("update"):
        assert resident(m) == ["grads", "optimizer", "policy"]
    with m.phase("validate"):
        assert "optimizer" not in resident(m) and ("policy" in resident(m)) == shared
    # the same bytes to generate either way: the policy's 480 + the fused 360 + the cache, or the copy's 840 + cache
    assert m.phase_peaks["rollout"] == 480 + 360 + 64
    assert m.phase_peaks["update"] == 480 + 480 + 960


def test_shared_or_not_the_policy_and_the_reference_are_never_resident_together():
    for shared in (False, True):
        m = ledger(shared)
        with m.phase("rollout"):
            m.groups["reference"].resident = True  # as a phase that asked for both would leave them
            with pytest.raises(RuntimeError, match="resident together"):
                with m.transient(0):
                    pass
            m.groups["reference"].resident = False
