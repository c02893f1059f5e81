"""`plan`: the command-line entry point. Each subcommand lives in its own short module."""

from __future__ import annotations

import sys

import click

from planner import __version__
from planner.datafile import inputs_scope
from planner.errors import PlannerError
from planner.specs import PlanError


class _Group(click.Group):
    """Turns planner errors into one line on stderr and an exit code (2 usage, 1 failure);
    click's own usage errors too (it prints four lines: usage, hint, blank, error)."""

    def main(self, *args, standalone_mode: bool = True, **kwargs):
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            rv = super().main(*args, standalone_mode=False, **kwargs)
        except click.UsageError as exc:
            command = exc.ctx.command_path if exc.ctx is not None else "plan"
            click.echo(f"error: {exc.format_message()} (`{command} --help` lists the options)", err=True)
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            click.echo(f"error: {exc.format_message()}", err=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("error: interrupted", err=True)
            sys.exit(130)
        sys.exit(rv if isinstance(rv, int) else 0)

    def invoke(self, ctx: click.Context):
        try:
            with inputs_scope():  # the files this command reads, which its -o must not replace
                return super().invoke(ctx)
        except PlannerError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except PlanError as exc:  # a plan the cost model refuses (e.g. FP8 on a device without it): the input's fault
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)


@click.group(cls=_Group)
@click.version_option(__version__, prog_name="plan")
def cli() -> None:
    """Plan, estimate, profile and run distributed training layouts (DP x TP x PP)."""


def _register() -> None:
    from planner.cli import estimate, export, presets, profile, run, schema, show, solve

    cli.add_command(presets.presets)
    cli.add_command(estimate.estimate)
    cli.add_command(solve.solve)
    cli.add_command(profile.profile)
    cli.add_command(run.run)
    cli.add_command(show.show)
    cli.add_command(export.export)
    cli.add_command(schema.schema)


_register()


def main() -> None:
    cli(prog_name="plan")


if __name__ == "__main__":
    main()
