"""docker-compose.yml, validated without Docker: structure, commands, ports, healthchecks.

Every ``kvroute`` command is parsed with the real argparse parsers, so a renamed flag or
subcommand breaks this test instead of the stack.
"""

from __future__ import annotations

import argparse
import json
import re
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from offload_core.engine_cli import build_parser as engine_parser
from router.cli import SUBCOMMANDS
from router.config import load_settings, parse_worker_spec
from router.serve import build_parser as serve_parser
from router.serve import exposure_problem, parse_tokenizers

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
ENGINES = sorted(name for name in SERVICES if name.startswith("engine-"))
PARSERS = {"serve": serve_parser, "engine": engine_parser}


def parse(service: str) -> tuple[str, argparse.Namespace]:
    """The service's ``kvroute`` subcommand and its parsed flags."""
    command = SERVICES[service]["command"]
    assert isinstance(command, list) and all(isinstance(c, str) for c in command)
    sub, *rest = command
    assert sub in SUBCOMMANDS, f"{service}: unknown kvroute subcommand {sub!r}"
    try:
        return sub, PARSERS[sub]().parse_args(rest)
    except SystemExit:
        pytest.fail(f"{service}: `kvroute {' '.join(command)}` does not parse")


def container_ports(service: str) -> set[int]:
    svc = SERVICES[service]
    ports = {int(str(p).split(":")[-1]) for p in svc.get("ports", [])}
    return ports | {int(p) for p in svc.get("expose", [])}


def host_ports() -> list[int]:
    """Host ports; every one is bound to loopback (``127.0.0.1:HOST:CONTAINER``)."""
    out = []
    for svc in SERVICES.values():
        for p in svc.get("ports", []):
            ip, host, _ = str(p).split(":")
            assert ip == "127.0.0.1", p
            out.append(int(host))
    return out


def port_of(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def dockerfile_stages() -> dict[str, str]:
    """``FROM ... AS name`` -> that stage's text."""
    stages: dict[str, str] = {}
    name = None
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith("FROM "):
            words = line.split()
            name = words[3] if len(words) >= 4 and words[2].upper() == "AS" else words[1]
            stages[name] = ""
        if name is not None and not line.lstrip().startswith("#"):
            stages[name] += line + "\n"
    return stages


def test_services_and_image() -> None:
    assert set(SERVICES) == {"redis", "router", "loadgen", "prometheus", "grafana", *ENGINES}
    assert len(ENGINES) == 3
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "FROM python:3.11-slim AS base" in dockerfile.splitlines()
    assert 'ENTRYPOINT ["kvroute"]' in dockerfile
    assert SERVICES["router"]["build"] == {"context": ".", "target": "router"}
    assert SERVICES["router"]["image"] == "kvroute-router:latest"
    for name in ENGINES:
        assert SERVICES[name]["build"] == {"context": ".", "target": "engine"}
        assert SERVICES[name]["image"] == "kvroute-engine:latest"
    assert SERVICES["redis"]["image"].startswith("redis:")
    # What the Dockerfile copies is what the package needs.
    for path in (
        "pyproject.toml",
        "setup.py",  # builds the compiled core (router/native)
        "constraints.txt",
        "schemas",
        "publisher",
        "offload_core",
    ):
        assert (ROOT / path).exists()
        assert path in dockerfile


def test_router_image_installs_no_torch() -> None:
    """The router's image installs the package without extras (pyproject keeps torch in
    the ``engine`` extra) and fails its build if torch is importable; the engine's image
    is the one with torch. Not run here: ``docker build`` itself (no Docker daemon in the
    test environment) - this checks the install lines and the dependency list."""
    stages = dockerfile_stages()
    assert {"base", "router", "engine"} <= set(stages)
    assert list(stages)[-1] == "router"  # a plain `docker build .` builds the router
    router_runs = [ln for ln in stages["router"].splitlines() if "pip install" in ln]
    assert len(router_runs) == 1
    assert "-c constraints.txt ." in router_runs[0]
    for banned in ("torch", "[engine", "TORCH_INDEX"):
        assert banned not in router_runs[0]
    assert "find_spec('torch') is not None" in stages["router"]
    for banned in ("torch", "[engine", "pip install"):
        assert banned not in stages["base"]
    assert "'.[engine]'" in stages["engine"] and "-c constraints.txt" in stages["engine"]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(
        d.split(">")[0].split("=")[0].strip() == "torch" for d in project["dependencies"]
    )
    assert project["optional-dependencies"]["engine"] == ["torch"]


def test_loadgen_drives_the_proxy_with_the_openai_client() -> None:
    svc = SERVICES["loadgen"]
    assert svc["environment"]["KVROUTE_URL"] == "http://router:8000/v1"
    assert "openai" in " ".join(svc["command"])
    assert svc["depends_on"]["router"]["condition"] == "service_healthy"
    source = (ROOT / "deploy/loadgen.py").read_text()
    assert "from openai import" in source or "import openai" in source
    assert "KVROUTE_URL" in source


def test_engines_bind_their_sockets_and_expose_them() -> None:
    ids = set()
    for name in ENGINES:
        sub, args = parse(name)
        assert sub == "engine"
        assert args.worker_id == name
        ids.add(args.worker_id)
        assert args.host == "0.0.0.0"
        # A concrete host would make the PUB socket connect (vLLM's rule), not bind.
        assert "*" in args.publish and "*" in args.replay
        exposed = container_ports(name)
        assert {args.port, port_of(args.publish), port_of(args.replay)} <= exposed
        assert args.cpu_blocks > 0  # offloading on
        assert "swa:" in args.groups  # a hybrid model
    assert len(ids) == len(ENGINES)


def test_router_uses_redis_and_registers_every_engine() -> None:
    sub, args = parse("router")
    assert sub == "serve" and args.index == "redis" and args.host == "0.0.0.0"
    redis_url = urlparse(args.redis_url)
    assert redis_url.scheme == "redis" and redis_url.hostname == "redis"
    assert redis_url.port == 6379 and 6379 in container_ports("redis")
    assert args.port in container_ports("router")
    specs = [parse_worker_spec(w) for w in args.workers]
    assert sorted(s.worker_id for s in specs) == ENGINES
    for spec in specs:
        _, engine = parse(spec.worker_id)
        pub, replay = urlparse(spec.endpoint), urlparse(spec.replay_endpoint or "")
        http = urlparse(spec.http_endpoint or "")
        assert pub.scheme == replay.scheme == "tcp"
        assert pub.hostname == replay.hostname == http.hostname == spec.worker_id
        assert pub.port == port_of(engine.publish)
        assert replay.port == port_of(engine.replay)
        assert http.port == engine.port


def test_published_ports_are_unique_and_documented() -> None:
    ports = host_ports()
    assert len(ports) == len(set(ports))
    header = (ROOT / "docker-compose.yml").read_text().split("name: kvroute")[0]
    for port in ports:
        assert str(port) in header, f"host port {port} is not documented in the header"


def test_healthchecks_and_start_order() -> None:
    for name, svc in SERVICES.items():
        test = svc["healthcheck"]["test"]
        assert test[0] == "CMD", name
    assert SERVICES["redis"]["healthcheck"]["test"][1:] == ["redis-cli", "ping"]
    _, router = parse("router")
    assert f"127.0.0.1:{router.port}/readyz" in SERVICES["router"]["healthcheck"]["test"][-1]
    for name in ENGINES:
        _, engine = parse(name)
        assert f"127.0.0.1:{engine.port}/health" in SERVICES[name]["healthcheck"]["test"][-1]
    depends = SERVICES["router"]["depends_on"]
    assert set(depends) == {"redis", *ENGINES}
    assert all(d["condition"] == "service_healthy" for d in depends.values())


def documented_metrics() -> set[str]:
    """Metric names in docs/observability.md's table (the one list of metrics)."""
    text = (ROOT / "docs/observability.md").read_text()
    return set(re.findall(r"^\| `(kvroute_[a-z0-9_]+)`", text, flags=re.M))


def metric_names(expr: str) -> set[str]:
    names = set(re.findall(r"\b(kvroute_[a-z0-9_]+)", expr))
    return {re.sub(r"_(bucket|sum|count)$", "", n) for n in names}


def test_alert_rules_and_grafana_use_documented_metrics() -> None:
    """deploy/: every expression names metrics the router exports (the documented table),
    and the alerts the issue asks for exist. Not run here: Prometheus/Grafana themselves."""
    documented = documented_metrics()
    rules = yaml.safe_load((ROOT / "deploy/alerts.yml").read_text())["groups"][0]["rules"]
    alerts = {r["alert"]: r["expr"] for r in rules}
    for required in (
        "KvrouteWorkerNotConnected",
        "KvrouteWorkerNotLive",
        "KvrouteResyncs",
        "KvrouteIngestLag",
        "KvrouteIndexDown",
        "KvrouteEstimateAccuracyDropping",
    ):
        assert required in alerts
    exprs = list(alerts.values())
    dashboard = json.loads((ROOT / "deploy/grafana/kvroute-dashboard.json").read_text())
    exprs += [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(exprs) > len(alerts)
    for expr in exprs:
        names = metric_names(expr)
        assert names, expr
        assert names <= documented, f"{expr}: {names - documented} not in docs/observability.md"


def test_prometheus_scrapes_the_router_and_loads_the_rules() -> None:
    prom = yaml.safe_load((ROOT / "deploy/prometheus.yml").read_text())
    (job,) = prom["scrape_configs"]
    _, router = parse("router")
    assert job["static_configs"][0]["targets"] == [f"router:{router.port}"]
    mounts = SERVICES["prometheus"]["volumes"]
    for rule_file in prom["rule_files"]:
        assert any(m.endswith(f":{rule_file}:ro") for m in mounts), rule_file


# The Compose Specification's service keys (what Compose v2 accepts), for a schema-free
# check: a typo or a v1-only key fails here rather than at `docker compose up`.
_KEYS = (
    "annotations attach blkio_config build cap_add cap_drop cgroup cgroup_parent command "
    "configs container_name cpu_count cpu_percent cpu_period cpu_quota cpu_rt_period "
    "cpu_rt_runtime cpu_shares cpus cpuset credential_spec depends_on deploy develop "
    "device_cgroup_rules devices dns dns_opt dns_search domainname entrypoint env_file "
    "environment expose extends external_links extra_hosts gpus group_add healthcheck "
    "hostname image init ipc isolation labels links logging mac_address mem_limit "
    "mem_reservation mem_swappiness memswap_limit network_mode networks oom_kill_disable "
    "oom_score_adj pid pids_limit platform ports post_start pre_stop privileged profiles "
    "pull_policy read_only restart runtime scale secrets security_opt shm_size stdin_open "
    "stop_grace_period stop_signal storage_opt sysctls tmpfs tty ulimits user userns_mode "
    "uts volumes volumes_from working_dir"
)
SERVICE_KEYS = set(_KEYS.split())
DURATION = re.compile(r"^(\d+(\.\d+)?(us|ms|s|m|h))+$")


def test_compose_v2_structure() -> None:
    """Compose v2 syntax without Docker: no obsolete ``version``, only spec keys, valid
    durations / restart policies / dependency conditions, build targets that are
    Dockerfile stages, bind mounts of files that exist, and no service outside a profile
    depending on one inside it. Not run here: ``docker compose config`` / ``up``."""
    assert "version" not in COMPOSE  # obsolete in v2 (a warning there, an error in v1 use)
    for key in COMPOSE:
        assert key in {"name", "services", "networks", "volumes", "configs", "secrets"} or (
            key.startswith("x-")
        ), key
    stages = set(dockerfile_stages())
    for name, svc in SERVICES.items():
        assert set(svc) <= SERVICE_KEYS, (name, set(svc) - SERVICE_KEYS)
        assert "image" in svc or "build" in svc, name
        if "build" in svc:
            assert (ROOT / svc["build"]["context"]).is_dir()
            assert svc["build"]["target"] in stages, name
        restart = svc.get("restart", "no")
        assert restart in {"no", "always", "unless-stopped"} or re.fullmatch(
            r"on-failure(:\d+)?", restart
        ), (name, restart)
        check = svc["healthcheck"]
        assert set(check) <= {"test", "interval", "timeout", "retries", "start_period"}
        for key in ("interval", "timeout", "start_period"):
            if key in check:
                assert DURATION.match(check[key]), (name, key, check[key])
        for dep, cond in svc.get("depends_on", {}).items():
            assert dep in SERVICES, (name, dep)
            assert cond["condition"] in {
                "service_started",
                "service_healthy",
                "service_completed_successfully",
            }
            assert "healthcheck" in SERVICES[dep] or cond["condition"] != "service_healthy"
            if "profiles" not in svc:
                assert "profiles" not in SERVICES[dep], (name, dep)
        for volume in svc.get("volumes", []):
            source, target, *mode = volume.split(":")
            assert source.startswith("./") and (ROOT / source).exists(), (name, source)
            assert target.startswith("/") and mode in ([], ["ro"]), (name, volume)
        env = svc.get("environment", {})
        assert isinstance(env, dict) and all(isinstance(v, str) for v in env.values()), name


def test_readme_says_how_to_run_it_with_compose_v2() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "docker compose up" in readme and "Compose v2" in readme
    assert "docker-compose up" not in readme  # the v1 command


def test_the_router_commands_pass_serves_start_up_checks() -> None:
    """Parsing is not enough: `kvroute serve --host 0.0.0.0` without a key is refused at
    start-up, which restarted the compose router in a loop."""
    dockerfile = (ROOT / "Dockerfile").read_text().splitlines()
    (cmd,) = [json.loads(line[4:]) for line in dockerfile if line.startswith('CMD ["serve"')]
    for command in (SERVICES["router"]["command"], cmd):
        args = serve_parser().parse_args(command[1:])
        overrides = {k: v for k, v in vars(args).items() if k != "config"}  # as serve does
        overrides["workers"] = [parse_worker_spec(w) for w in overrides["workers"] or []]
        overrides["tokenizers"] = parse_tokenizers(overrides["tokenizers"] or [])
        settings = load_settings(None, **overrides)
        assert exposure_problem(settings) is None, command
