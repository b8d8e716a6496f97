"""The ``shardsched`` command line (click)."""

from __future__ import annotations

import logging
import sys

import click

from shardsched import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="shardsched")
@click.option("-v", "--verbose", count=True, help="More logging on stderr (-v info, -vv debug).")
def cli(verbose: int) -> None:
    """shardsched: a sharded, batched Kubernetes pod scheduler with kube-scheduler's semantics.

    \b
    Main job (embedded: local Ray, local Redis, simulated cluster):
      shardsched run                      the field report's 5,000-node burst
    What-if placement of manifests:
      shardsched simulate -f pods.yaml
    """
    level = logging.WARNING - 10 * verbose
    logging.basicConfig(level=max(level, logging.DEBUG), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _register() -> None:
    from shardsched.cli import simulate as simulate_cmd

    cli.add_command(simulate_cmd.simulate)
    for module_name in ("run", "bench", "serve", "scale"):
        try:
            module = __import__(f"shardsched.cli.{module_name}", fromlist=[module_name])
        except ModuleNotFoundError as e:
            if e.name != f"shardsched.cli.{module_name}":
                raise
            continue
        cli.add_command(getattr(module, module_name))


_register()


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="shardsched")


if __name__ == "__main__":
    main()
