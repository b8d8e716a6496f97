"""``shardsched`` commands run as processes of their own, without paying the imports each time.

A command run as ``python -m shardsched.cli.main ...`` spends seconds importing (numpy, the
scheduler, the manifest validation) before it reads its input; a test file that runs the CLI
dozens of times spends most of its time there. `run_cli` forks each command from a fork server
that imported those modules once (multiprocessing's ``forkserver``, started on first use): the
command still runs in a process of its own, with its own environment, working directory,
standard streams (stdin empty, stdout and stderr captured) and exit status, and nothing it does
outlives it. Its result is a `subprocess.CompletedProcess` as ``subprocess.run(...,
capture_output=True, text=True)`` gives.

What a fresh interpreter decides at start-up stays as the fork server decided it with this test
session's environment (the streams' encoding): a test about that, or about a terminal, runs the
real ``python -m`` command instead.
"""

from __future__ import annotations

import io
import locale
import multiprocessing
import os
import subprocess
import sys
import tempfile
import traceback
from typing import Mapping, Sequence

#: imported once by the fork server (each command then forks from it): simulate's, serve's and
#: run's modules (a module that fails to import is left to the command, which then says why)
PRELOAD = ["shardsched.cli.main", "shardsched.scheduler.simulate", "shardsched.metrics", "shardsched.kube.cluster",
           "shardsched.kube.serving", "shardsched.kube.leader", "shardsched.bench.serve", "shardsched.sharding.shard",
           "shardsched.sharding.embedded"]

_context = None


def _server():
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
    return _context


def _command(args: list[str], env: dict[str, str], cwd: str | None, out: str, err: str) -> None:
    """The forked process: the streams onto ``out``/``err``, then the CLI as ``main()`` runs it."""
    os.environ.clear()
    os.environ.update(env)
    if cwd is not None:
        os.chdir(cwd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, out), (2, err)):
        f = os.open(path, os.O_WRONLY | os.O_TRUNC)
        os.dup2(f, fd)
        os.close(f)
    encoding = locale.getpreferredencoding(False)
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding=encoding)
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding=encoding, errors="strict")
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding=encoding, errors="backslashreplace",
                                  line_buffering=True)
    sys.argv = [sys.executable, *args]
    code = 0
    try:
        from shardsched.cli.main import cli

        cli.main(args, prog_name="shardsched")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int) and e.code is not None:
            print(e.code, file=sys.stderr)
    except BaseException:  # as the interpreter does with an uncaught exception
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
    os._exit(code)


def warm() -> None:
    """Start the fork server and wait until it has imported `PRELOAD` (the first command waits
    for that otherwise): for a test that times its command."""
    done = run_cli(["--help"])
    assert done.returncode == 0, done.stderr


def run_cli(args: Sequence[str], env: Mapping[str, str] | None = None, cwd: str | None = None,
            timeout: float = 120.0) -> subprocess.CompletedProcess:
    """``shardsched *args`` in a process forked from the fork server (module docstring), with
    ``env`` as its whole environment (default: this process's) and ``cwd``; waits at most
    ``timeout`` seconds (then kills it and raises `subprocess.TimeoutExpired`)."""
    args = [str(a) for a in args]
    with tempfile.TemporaryDirectory(prefix="cli-") as tmp:
        out, err = os.path.join(tmp, "out"), os.path.join(tmp, "err")
        for path in (out, err):
            open(path, "wb").close()
        proc = _server().Process(target=_command, args=(args, dict(os.environ if env is None else env), cwd, out, err))
        proc.start()
        proc.join(timeout)
        if proc.exitcode is None:
            proc.kill()
            proc.join()
            raise subprocess.TimeoutExpired(["shardsched", *args], timeout)
        encoding = locale.getpreferredencoding(False)
        texts = []
        for path in (out, err):
            with open(path, "rb") as f:
                texts.append(io.TextIOWrapper(io.BytesIO(f.read()), encoding=encoding).read())
    return subprocess.CompletedProcess(["shardsched", *args], proc.exitcode, texts[0], texts[1])
