"""Scheduler-side lookups agree with the HMA rule and honour "not known yet" (None)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from offload_core.base import (
    LoadStoreSpec,
    OffloadingEvent,
    OffloadingManager,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    make_offload_key,
)
from offload_core.cpu import CPUOffloadingManager
from offload_core.lookup import (
    RequestOffloadState,
    lookup_group,
    lookup_longest_hit,
    lookup_mamba,
    lookup_prefix,
    lookup_sliding_window,
)
from schemas.hit_rule import GroupSpec, group_max_hit, longest_hit

CTX = ReqContext()
FULL = GroupSpec("full_attention", 16)
SWA = GroupSpec("sliding_window", 16, 48)  # ceil(47/16) = 3 blocks
MAMBA = GroupSpec("mamba", 16)


def digest(i: int) -> bytes:
    return hashlib.sha256(str(i).encode()).digest()


def keys(n: int, group: int = 0) -> list[OffloadKey]:
    return [make_offload_key(digest(i), group) for i in range(n)]


class TableManager(OffloadingManager):
    """A lookup-only manager answering from a table, like a remote tier whose answers
    arrive over time; it records which keys were asked. Store/load are not used here."""

    def __init__(self, answers: dict[OffloadKey, bool | None]) -> None:
        self.answers = answers
        self.asked: list[OffloadKey] = []

    def lookup(self, key: OffloadKey, ctx: ReqContext) -> bool | None:
        self.asked.append(key)
        return self.answers.get(key, False)

    def prepare_load(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> LoadStoreSpec:
        raise NotImplementedError

    def touch(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> None:
        raise NotImplementedError

    def complete_load(self, keys: Sequence[OffloadKey], ctx: ReqContext) -> None:
        raise NotImplementedError

    def prepare_store(
        self, keys: Sequence[OffloadKey], ctx: ReqContext
    ) -> PrepareStoreOutput | None:
        raise NotImplementedError

    def complete_store(
        self, keys: Sequence[OffloadKey], ctx: ReqContext, success: bool = True
    ) -> None:
        raise NotImplementedError

    def take_events(self) -> Iterable[OffloadingEvent]:
        return []


VAL: dict[str, bool | None] = {"1": True, "0": False, "?": None}


def table(ks: list[OffloadKey], pattern: str) -> TableManager:
    """``pattern[i]``: '1' hit, '0' miss, '?' not known yet."""
    return TableManager({k: VAL[c] for k, c in zip(ks, pattern, strict=True)})


def cpu_with(
    ks: Sequence[OffloadKey], cached: Sequence[bool], capacity: int = 256
) -> CPUOffloadingManager:
    m = CPUOffloadingManager(capacity)
    wanted = [k for k, c in zip(ks, cached, strict=False) if c]
    out = m.prepare_store(wanted, CTX)
    assert out is not None
    m.complete_store(out.keys_to_store, CTX)
    return m


# -- per-group lookups ------------------------------------------------------------------


def test_prefix_lookup() -> None:
    ks = keys(6)
    assert lookup_prefix(table(ks, "111011"), ks, CTX) == 3
    assert lookup_prefix(table(ks, "111111"), ks, CTX) == 6
    assert lookup_prefix(table(ks, "11?011"), ks, CTX) is None
    m = table(ks, "110?11")
    assert lookup_prefix(m, ks, CTX) == 2  # the unknown block lies past the first miss
    assert len(m.asked) == 3


def test_sliding_window_lookup() -> None:
    ks = keys(8)
    # Old blocks evicted: the window at the end is intact.
    m = table(ks, "00001111")
    assert lookup_sliding_window(m, ks, 3, CTX) == 8
    assert m.asked == ks[7:4:-1]  # only the window is asked about, from the right
    # A hole inside the window pulls back to the last intact window: [3, 6).
    assert lookup_sliding_window(table(ks, "11111011"), ks, 3, CTX) == 5
    # A short run reaching block 0 is enough.
    assert lookup_sliding_window(table(ks, "11000000"), ks, 3, CTX) == 2
    assert lookup_sliding_window(table(ks, "01000000"), ks, 3, CTX) == 0
    # The rightmost sufficient run wins even with long runs further left.
    assert lookup_sliding_window(table(ks, "11111011"), ks, 2, CTX) == 8
    # Unknown inside the window under test: defer. Unknown long outside it: ignored.
    assert lookup_sliding_window(table(ks, "11111?11"), ks, 3, CTX) is None
    assert lookup_sliding_window(table(ks, "?0?01111"), ks, 3, CTX) == 8
    assert lookup_sliding_window(table([], ""), [], 3, CTX) == 0


def test_mamba_lookup() -> None:
    ks = keys(6)
    assert lookup_mamba(table(ks, "010100"), ks, CTX) == 4
    assert lookup_mamba(table(ks, "000000"), ks, CTX) == 0
    assert lookup_mamba(table(ks, "0101?0"), ks, CTX) is None
    assert lookup_mamba(table(ks, "?10110"), ks, CTX) == 5


# -- hybrid ----------------------------------------------------------------------------


def test_hybrid_full_plus_window_with_a_hole() -> None:
    full, swa = keys(10, 0), keys(10, 1)
    cached_full = [True] * 10
    cached_swa = [i not in (0, 1, 2, 7) for i in range(10)]  # old blocks gone, hole at 7
    m = cpu_with(full + swa, cached_full + cached_swa)
    got = lookup_longest_hit(m, 161, [FULL, SWA], [full, swa], CTX)
    assert got == longest_hit(161, [FULL, SWA], [cached_full, cached_swa]) == 112


def test_hybrid_defers_on_unknown_then_answers() -> None:
    full, swa = keys(6, 0), keys(6, 1)
    answers: dict[OffloadKey, bool | None] = dict.fromkeys(full + swa, True)
    answers[swa[4]] = None
    m = TableManager(answers)
    assert lookup_longest_hit(m, 97, [FULL, SWA], [full, swa], CTX) is None
    answers[swa[4]] = True
    assert lookup_longest_hit(m, 97, [FULL, SWA], [full, swa], CTX) == 96


def _cases() -> st.SearchStrategy[tuple[int, list[GroupSpec], list[list[str]]]]:
    @st.composite
    def build(draw: st.DrawFn) -> tuple[int, list[GroupSpec], list[list[str]]]:
        groups = []
        for _ in range(draw(st.integers(1, 3))):
            kind = draw(st.sampled_from(["full_attention", "sliding_window", "mamba"]))
            window = draw(st.integers(1, 30)) if kind == "sliding_window" else None
            groups.append(GroupSpec(kind, draw(st.sampled_from([1, 2, 4, 6])), window))
        request_tokens = draw(st.integers(0, 72))
        pattern = []
        for g in groups:
            n = draw(st.integers(0, request_tokens // g.block_size + 1))
            cell = st.sampled_from("1110") | st.sampled_from("11110?")
            pattern.append(draw(st.lists(cell, min_size=n, max_size=n)))
        return request_tokens, groups, pattern

    return build()


@settings(max_examples=300, deadline=None)
@given(_cases())
def test_lookups_agree_with_hit_rule(case: tuple[int, list[GroupSpec], list[list[str]]]) -> None:
    request_tokens, groups, pattern = case
    ks = [keys(len(p), g) for g, p in enumerate(pattern)]
    answers: dict[OffloadKey, bool | None] = {}
    for group_keys, p in zip(ks, pattern, strict=True):
        answers.update({k: VAL[c] for k, c in zip(group_keys, p, strict=True)})
    got = lookup_longest_hit(TableManager(answers), request_tokens, groups, ks, CTX)
    # Whatever the unknown blocks turn out to be, a definite answer must be the rule's.
    for fill in (True, False):
        cached = [[{"1": True, "0": False, "?": fill}[c] for c in p] for p in pattern]
        if got is not None:
            assert got == longest_hit(request_tokens, groups, cached)
    if all("?" not in p for p in pattern):
        assert got is not None
        # Each group's own lookup agrees with the rule's per-group maximum as well.
        for g, (spec, group_keys) in enumerate(zip(groups, ks, strict=True)):
            cached_g = [c == "1" for c in pattern[g]]
            end = lookup_group(spec, TableManager(answers), group_keys, CTX)
            b = spec.block_size
            limit = len(group_keys) * b
            assert end is not None
            assert end * b == group_max_hit(spec, cached_g, limit, b)


@settings(max_examples=100, deadline=None)
@given(_cases())
def test_cpu_manager_lookups_agree_with_hit_rule(
    case: tuple[int, list[GroupSpec], list[list[str]]],
) -> None:
    request_tokens, groups, pattern = case
    state = RequestOffloadState("r", groups)
    cached = [[c == "1" for c in p] for p in pattern]
    all_keys: list[OffloadKey] = []
    all_cached: list[bool] = []
    for group, c in zip(state.groups, cached, strict=True):
        group.add_block_hashes(digest(i) for i in range(len(c)))
        all_keys += group.keys
        all_cached += c
    m = cpu_with(all_keys, all_cached)
    assert state.lookup(m, request_tokens) == longest_hit(request_tokens, groups, cached)


# -- per-request state -----------------------------------------------------------------


def test_request_state_keys_and_needed_ranges() -> None:
    state = RequestOffloadState("req-1", [FULL, SWA, MAMBA])
    for group in state.groups:
        group.add_block_hashes(digest(i) for i in range(8))
        group.block_ids.extend(range(100 * group.group_idx, 100 * group.group_idx + 8))
    full, swa, mamba = state.groups
    assert swa.keys[2] == make_offload_key(digest(2), 1)
    assert full.needed_range(128) == range(0, 8)
    assert swa.needed_range(128) == range(5, 8)
    assert mamba.needed_range(128) == range(7, 8)
    assert swa.needed_range(32) == range(0, 2)
    # Beyond a GPU hit of 96 tokens only the rest must come from the offload tier.
    assert full.needed_range(128, start_tokens=96) == range(6, 8)
    assert swa.needed_range(128, start_tokens=96) == range(6, 8)
    assert mamba.needed_range(64, start_tokens=96) == range(4, 4)
    assert state.needed_keys(128, 112) == [full.keys[7], swa.keys[7], mamba.keys[7]]
    assert swa.block_ids[swa.needed_range(128).start] == 105


def test_touch_skips_blocks_outside_the_window() -> None:
    state = RequestOffloadState("req-2", [SWA])
    (swa,) = state.groups
    swa.add_block_hashes(digest(i) for i in range(8))
    m = CPUOffloadingManager(8, policy="lru")
    out = m.prepare_store(list(reversed(swa.keys)), CTX)  # block 7 oldest, block 0 newest
    assert out is not None
    m.complete_store(out.keys_to_store, CTX)
    state.touch(m, 128)  # refreshes only blocks 5, 6, 7
    assert m.policy.keys()[:5] == list(reversed(swa.keys[:5]))  # type: ignore[attr-defined]
    assert m.policy.keys()[5:] == swa.keys[5:]  # type: ignore[attr-defined]
    # Under pressure the dead blocks go first and the window survives.
    out = m.prepare_store(keys(5, 9), CTX)
    assert out is not None and set(out.evicted_keys) == set(swa.keys[:5])
    assert state.lookup(m, 129) == 128
