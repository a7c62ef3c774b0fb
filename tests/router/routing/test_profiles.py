"""Route profiles: named weight sets reach the router, the bench and the docs alike."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import pytest
from _helpers import free_port, serve_app
from pydantic import ValidationError

from router import serve
from router.bench import main as bench_main
from router.bench.commands import build_parser, engine_mismatch
from router.config import RouterSettings, WorkerSpec
from router.http.app import create_app
from router.routing.base import PolicyWeights
from router.routing.profiles import (
    DEFAULT_PROFILE,
    PROFILE_NAMES,
    ROUTE_PROFILES,
    check_profile,
    profile_weights,
)
from router.service import RouterService

ROOT = Path(__file__).resolve().parents[3]
TRACE = ROOT / "benchmarks/data/mooncake_conversation_trace.jsonl"


def test_default_profile_is_the_weights_defaults() -> None:
    assert profile_weights() == PolicyWeights()
    assert profile_weights(DEFAULT_PROFILE, {}) == PolicyWeights()
    assert PROFILE_NAMES[0] == DEFAULT_PROFILE


@pytest.mark.parametrize("name", [n for n in PROFILE_NAMES if n != DEFAULT_PROFILE])
def test_each_profile_sets_its_weights_and_nothing_else(name: str) -> None:
    weights = profile_weights(name)
    changed = {
        f.name: getattr(weights, f.name)
        for f in dataclasses.fields(PolicyWeights)
        if getattr(weights, f.name) != getattr(PolicyWeights(), f.name)
    }
    assert changed == dict(ROUTE_PROFILES[name])


def test_route_weights_apply_on_top_of_a_profile() -> None:
    w = profile_weights("capped-prefill", {"prefill_cap": "2048"})
    assert w.prefill_cap == 2048 and w.prefill_large == 1.5 and w.backlog_large == 0.06


def test_unknown_profile_or_weight_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown route profile 'capped'"):
        check_profile("capped")
    with pytest.raises(ValueError, match="unknown route weight"):
        profile_weights("hits-first", {"prefil_large": 3})
    with pytest.raises(ValidationError, match="unknown route profile"):
        RouterSettings(route_profile="fastest")


def test_a_bad_profile_in_the_environment_stops_the_server_with_a_message(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for key in list(os.environ):
        if key.startswith("KVROUTE_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("KVROUTE_ROUTE_PROFILE", "fastest")
    assert serve.main(["--port", str(free_port())]) == 2
    assert "unknown route profile 'fastest'" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # the flag offers the profiles as its choices
        serve.main(["--route-profile", "fastest"])
    assert "choose from 'default', 'hits-first'" in capsys.readouterr().err


async def test_the_router_routes_with_its_profile_and_reports_it() -> None:
    settings = RouterSettings(
        workers=[WorkerSpec(worker_id="solo", endpoint=f"tcp://127.0.0.1:{free_port()}")],
        route_profile="capped-prefill",
        route_weights={"prefill_cap": 8192.0},
    )
    service = RouterService(settings)
    async with serve_app(create_app(service)) as client:
        assert (await client.post("/v1/route", json={"token_ids": [1, 2]})).status_code == 200
        core = service.routing  # type: ignore[attr-defined]
        assert core.config.profile == "capped-prefill"
        assert core.config.weights.prefill_cap == 8192 and core.config.weights.prefill_large == 1.5
        metrics = (await client.get("/metrics")).text
        assert (
            'kvroute_route_config_info{policy="kv_aware",profile="capped-prefill"} 1.0' in metrics
        )


def test_bench_routing_takes_a_profile_and_weights_on_top(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["routing", "--trace", str(TRACE), "--limit", "40", "--workers", "2", "--jobs", "1"]
    args += ["--policy", "kv_aware", "--json", "--profile", "hits-first"]
    assert bench_main([*args, "--weights", "backlog=0.2"]) == 0
    config = json.loads(capsys.readouterr().out)["config"]
    assert config["profile"] == "hits-first"
    assert config["weights"]["prefill_large"] == 2.0 and config["weights"]["backlog"] == 0.2
    with pytest.raises(SystemExit):
        bench_main([*args[:-1], "fastest"])


def test_the_docs_table_lists_every_profile_with_its_weights() -> None:
    """docs/routing.md's profile table is what users copy from: it must match the code."""
    text = (ROOT / "docs/routing.md").read_text()
    section = re.split(r"\n##+ ", text.split("### Route profiles", 1)[1], maxsplit=1)[0]
    rows = {
        m.group(1): m.group(2)
        for m in re.finditer(r"^\| `([a-z-]+)` \| ([^|]*) \|", section, flags=re.MULTILINE)
    }
    assert set(rows) == set(PROFILE_NAMES)
    for name, cell in rows.items():
        documented = dict(re.findall(r"`(\w+)=([\d.]+)`", cell))
        assert {k: float(v) for k, v in documented.items()} == dict(ROUTE_PROFILES[name])


CHARGED = ["--engine-model", "charged", "--long-prefill-threshold"]


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--profile", "capped-prefill"], "--engine-model charged --long-prefill-threshold 4096"),
        (["--profile", "capped-prefill", *CHARGED, "2048"], "add --weights prefill_cap=2048"),
        ([*CHARGED, "4096"], "--profile capped-prefill --weights prefill_cap=4096"),
        (["--profile", "capped-prefill", *CHARGED, "4096"], None),
        (["--profile", "capped-prefill", "--weights", "prefill_cap=2048", *CHARGED, "2048"], None),
        (["--profile", "hits-first"], None),
    ],
)
def test_bench_routing_says_when_prefill_cap_and_the_engines_disagree(
    extra: list[str], says: str | None
) -> None:
    args = build_parser().parse_args(["routing", "--trace", str(TRACE), *extra])
    note = engine_mismatch(args)
    assert note is None if says is None else (note is not None and says in note)


def test_the_mismatch_note_goes_to_stderr_and_the_run_goes_on(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["routing", "--trace", str(TRACE), "--limit", "20", "--workers", "2", "--jobs", "1"]
    assert bench_main([*args, "--policy", "kv_aware", "--json", "--profile", "capped-prefill"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["config"]["profile"] == "capped-prefill"
    assert "kvroute bench: note: kv_aware's prefill_cap is 4096" in out.err
