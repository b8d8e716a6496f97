"""What a user sees from ``run``, ``bench`` and ``serve`` when an option is wrong or does not fit:
a usage error (exit status 2, click's ``Error: Invalid value for '--option'``) or one ``error:``
line before anything starts, never a traceback; options documented in ``--help``; tables as wide
as their content when stdout is not a terminal."""

from __future__ import annotations

import socket

import pytest
from click.testing import CliRunner

from forked_cli import run_cli
from shardsched.cli import PIPE_WIDTH
from shardsched.cli.main import cli
from shardsched.cli.run import _print_summary
from shardsched.sharding.run_report import RunReport


@pytest.mark.parametrize("args, option, message", [
    (["run", "--bind-latency-ms", "-5"], "--bind-latency-ms", "-5.0 is not in the range x>=0"),
    (["run", "--bind-latency-ms", "nan"], "--bind-latency-ms", "'nan' is not a finite number"),
    (["run", "--bind-latency-ms", "inf"], "--bind-latency-ms", "'inf' is not a finite number"),
    (["run", "--bind-error-rate", "nan"], "--bind-error-rate", "'nan' is not a finite number"),
    (["run", "--timeout", "nan"], "--timeout", "'nan' is not a finite number"),
    (["run", "--time-scale", "nan"], "--time-scale", "'nan' is not a finite number"),
    (["bench", "field", "--bind-latency-ms", "nan"], "--bind-latency-ms", "'nan' is not a finite number"),
    (["bench", "field", "--timeout", "-1"], "--timeout", "-1.0 is not in the range x>0"),
    (["bench", "field", "--node-cpu", "2Gx"], "--node-cpu", "invalid quantity '2Gx' for cpu"),
    (["bench", "field", "--pod-memory", "-1Gi"], "--pod-memory", "memory"),
], ids=["negative-latency", "nan-latency", "inf-latency", "nan-error-rate", "nan-timeout", "nan-time-scale",
        "bench-nan-latency", "bench-negative-timeout", "bench-node-cpu", "bench-negative-pod-memory"])
def test_a_bad_number_is_a_usage_error(args, option, message):
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert f"Error: Invalid value for '{option}': " in result.output and message in result.output, result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("option, value", [("--trace-limit", "10"), ("--time-scale", "1000")])
def test_a_trace_option_without_a_trace_is_a_usage_error(option, value):
    result = CliRunner().invoke(cli, ["run", option, value])
    assert result.exit_code == 2, result.output
    assert f"Error: {option} goes with --trace" in result.output and "Traceback" not in result.output


def test_a_metrics_port_in_use_is_said_before_anything_starts(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = run_cli(["run", "--nodes", "2", "--pods", "2", "--metrics-port", str(port)], timeout=120,
                       cwd=str(tmp_path))
    assert proc.returncode == 1
    # one line, and nothing of Ray's start-up (its token note, its logs) before it
    assert proc.stderr == f"error: --metrics-port {port}: Address already in use (127.0.0.1:{port})\n", proc.stderr


@pytest.mark.parametrize("command", [["run"], ["serve"], ["simulate"], ["bench", "field"], ["bench", "perf"], ["bench", "scaling"],
                                     ["bench", "decision"]], ids=lambda c: "-".join(c))
def test_every_option_has_help(command):
    """``--help`` documents every option: no option line without its text."""
    from click import Command

    cmd: Command = cli
    for name in command:
        cmd = cmd.get_command(None, name)  # type: ignore[attr-defined]
    undocumented = [p.opts[0] for p in cmd.params if not getattr(p, "help", None) and p.opts[0] != "--help"
                    and p.opts[0] not in ("-o", "--output")]
    assert undocumented == []


def test_node_and_pod_quantities_are_one_type_in_run_and_bench_field():
    run_help = CliRunner().invoke(cli, ["run", "--help"], terminal_width=200).output
    field_help = CliRunner().invoke(cli, ["bench", "field", "--help"], terminal_width=200).output
    for option in ("--node-cpu", "--node-memory", "--pod-cpu", "--pod-memory"):
        assert f"{option} QUANTITY" in run_help and f"{option} QUANTITY" in field_help, option


def _summary(report: RunReport, capsys) -> list[str]:
    _print_summary(report)
    return capsys.readouterr().out.splitlines()


def test_the_run_summary_is_not_wrapped_at_80_columns_without_a_terminal(capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    report = RunReport(pods_total=10, pods_bound=10, nodes=2, shards=2, schedule_wall_s=1.0, wall_s=2.0,
                       latencies_s=[0.1] * 10)
    lines = _summary(report, capsys)
    assert max(map(len, lines)) > 80, lines
    assert max(map(len, lines)) <= PIPE_WIDTH
    monkeypatch.setenv("COLUMNS", "90")  # the width a user asks for is kept
    assert max(map(len, _summary(report, capsys))) <= 90
