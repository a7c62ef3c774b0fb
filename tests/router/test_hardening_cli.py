"""Issue 14 (loud mistakes, safe defaults): unknown settings are errors, serving beyond
loopback needs a key or an explicit flag, every flag has help, ``--version``, and a
missing optional dependency gets one line naming the extra."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from router import cli, serve
from router.config import RouterSettings, check_unknown_keys

REPO = Path(__file__).resolve().parents[2]


def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("KVROUTE_"):
            monkeypatch.delenv(key)


def test_unknown_config_file_key_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    _clean_env(monkeypatch)
    cfg = tmp_path / "router.yaml"
    cfg.write_text("worker:\n  - a=tcp://127.0.0.1:9\nmax_request_tokens: 5\n")
    assert serve.main(["--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "unknown config file key(s): worker (did you mean workers?)" in err


def test_unknown_kvroute_env_var_is_an_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    _clean_env(monkeypatch)
    monkeypatch.setenv("KVROUTE_WORKER", "a=tcp://127.0.0.1:9")
    assert serve.main([]) == 2
    err = capsys.readouterr().err
    assert "KVROUTE_WORKER (did you mean KVROUTE_WORKERS?)" in err


def test_known_env_vars_pass_the_check():
    env = {"KVROUTE_CONFIG": "x", "KVROUTE_PORT": "1", "KVROUTE_API_KEY_ALL": "1", "PATH": "/"}
    env["KVROUTE_NATIVE"] = "0"  # the compiled core's switch (docs/development.md): not a typo
    check_unknown_keys({"port": 1, "workers": []}, env)
    with pytest.raises(ValueError, match="KVROUTE_PROT"):
        check_unknown_keys(None, {"KVROUTE_PROT": "1"})


def test_remote_bind_without_key_needs_the_explicit_flag(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    _clean_env(monkeypatch)
    assert serve.main(["--host", "0.0.0.0"]) == 2
    assert "--allow-insecure-remote" in capsys.readouterr().err
    assert serve.exposure_problem(RouterSettings(host="0.0.0.0", api_key="k")) is None
    assert (
        serve.exposure_problem(RouterSettings(host="10.1.2.3", allow_insecure_remote=True)) is None
    )
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        assert serve.exposure_problem(RouterSettings(host=host)) is None


def test_insecure_remote_warns_at_start_up(tmp_path: Path):
    """With the flag, the server starts and says so (checked up to the uvicorn start)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVROUTE_")}
    # An invalid worker stops it right after the warning, before it binds anything.
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "router.cli",
            "serve",
            "--host",
            "0.0.0.0",
            "--allow-insecure-remote",
            "--max-workers",
            "1",
            "--worker",
            "a=tcp://127.0.0.1:9",
            "--worker",
            "b=tcp://127.0.0.1:10",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "WITHOUT an API key" in proc.stderr
    assert "max_workers" in proc.stderr


def test_version(capsys: pytest.CaptureFixture[str]):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"kvroute {cli.version()}"
    assert cli.version() != "unknown"


def _parsers() -> list[argparse.ArgumentParser]:
    from offload_core.engine_cli import build_parser as engine
    from router.bench.commands import build_parser as bench
    from router.ops.demo import build_parser as demo
    from router.ops.tail import build_parser as tail
    from router.serve import build_parser as serve_parser

    out = [serve_parser(), engine(), demo(), tail(), bench()]
    for p in list(out):
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                out.extend(action.choices.values())
    return out


def test_every_cli_flag_has_help():
    missing = [
        f"{p.prog} {'/'.join(a.option_strings) or a.dest}"
        for p in _parsers()
        for a in p._actions
        if not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)
        and not (a.help or "").strip()
    ]
    assert missing == []


def test_engine_defaults_keep_what_always_binds_on_loopback():
    from offload_core.engine_cli import build_parser

    args = build_parser().parse_args([])
    assert args.host == "127.0.0.1"
    assert args.replay.startswith("tcp://127.0.0.1:")


def test_engine_without_torch_names_the_extra():
    """In the router-only install `kvroute engine --help` is one line, not a traceback."""
    code = (
        "import sys\n"
        "class NoTorch:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch' or name.startswith('torch.'):\n"
        "            raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n"
        "sys.meta_path.insert(0, NoTorch())\n"
        "from router.cli import main\n"
        "sys.exit(main(['engine', '--help']))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'kvroute[engine]'" in lines[0], proc.stderr
