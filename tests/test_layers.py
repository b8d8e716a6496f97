"""The layer rules of pyproject.toml's ``[tool.importlinter]`` contracts, checked with import-linter:
the scheduling core imports no client of an outside system, plugins import neither the sharded
runtime nor a cluster backend, the framework imports no concrete plugin, the two cluster backends
(kube, sim) do not import each other, the cluster contract imports neither, and the scheduler
imports no test infrastructure, and only the actor layer imports Ray."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: ``lint-imports`` of the running interpreter's import-linter
_LINT_IMPORTS = ("import sys; from importlinter.cli import lint_imports_command; "
                 "sys.argv[0] = 'lint-imports'; lint_imports_command()")


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """Run ``lint-imports`` on the ``shardsched`` package under ``root`` with ``root``'s pyproject.toml."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([sys.executable, "-c", _LINT_IMPORTS, "--no-cache", "--no-logo",
                           "--config", str(root / "pyproject.toml")],
                          cwd=root, env=env, capture_output=True, text=True, timeout=120)


def test_layer_contracts_are_kept():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout, result.stdout


def test_a_forbidden_import_breaks_a_contract(tmp_path):
    """The contracts catch a forbidden import: the framework importing a concrete plugin, and the
    queue importing Ray, in a copy of the package."""
    shutil.copytree(ROOT / "shardsched", tmp_path / "shardsched", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with open(tmp_path / "shardsched" / "framework" / "status.py", "a") as f:
        f.write("\nfrom shardsched.plugins.queuesort import plugin as _queuesort  # noqa: E402,F401\n")
    with open(tmp_path / "shardsched" / "queue" / "clock.py", "a") as f:
        f.write("\nimport ray  # noqa: E402,F401\n")
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    assert "shardsched.framework is not allowed to import shardsched.plugins" in result.stdout, result.stdout
    assert "shardsched.queue is not allowed to import ray" in result.stdout, result.stdout
    assert "2 broken" in result.stdout, result.stdout


def test_ray_outside_the_actor_layer_breaks_a_contract(tmp_path):
    """Only the actor layer imports Ray: the coordinator package importing it breaks the contract;
    the actor layer's own import (sharding.remote) and a module using the actor layer do not."""
    shutil.copytree(ROOT / "shardsched", tmp_path / "shardsched", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with open(tmp_path / "shardsched" / "sharding" / "coordinator" / "health.py", "a") as f:
        f.write("\nimport ray  # noqa: E402,F401\n")
    with open(tmp_path / "shardsched" / "cli" / "scale.py", "a") as f:
        f.write("\nfrom shardsched.sharding import remote as _remote  # noqa: E402,F401\n")
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    assert "shardsched.sharding.coordinator is not allowed to import ray" in result.stdout, result.stdout
    assert "shardsched.sharding.coordinator.health -> ray" in result.stdout, result.stdout
    assert "shardsched.cli" not in result.stdout.split("Broken contracts")[-1], result.stdout
    assert "1 broken" in result.stdout, result.stdout
