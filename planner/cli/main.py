"""`plan`: the command-line entry point. Each subcommand lives in its own short module.

The entry point is also the output guard (_Group.main, _guarded): however a command ends, what
reaches stderr is at most one line, "error: ..." with control characters escaped
(render.printable), and the exit code says how it ended: 2 bad input, 1 failure (a closed
stdout, a full disk, an encoding that cannot write the output among them), 130 Ctrl-C, 1 and
nothing on stderr when the reader of a pipe has gone (`plan presets | head -1`, as click and
the Python documentation's "Note on SIGPIPE" do). Never a traceback.
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Any, Callable

from planner import _interrupt
from planner._pdeath import end_in_one_line

_interrupt.hold()  # Ctrl-C while the imports below load (most of a second): the guard's line, not a traceback
end_in_one_line()  # SIGTERM / SIGHUP outside a command's own handlers: one line, 143 / 129, not a silent death

import click  # noqa: E402 (after the hook above)

from planner import __version__  # noqa: E402
from planner.cli.render import printable  # noqa: E402
from planner.datafile import inputs_scope  # noqa: E402
from planner.errors import PlannerError  # noqa: E402
from planner.specs import PlanError  # noqa: E402


class _Group(click.Group):
    """Turns planner errors into one line on stderr and an exit code (2 usage, 1 failure);
    click's own usage errors too (it prints four lines: usage, hint, blank, error)."""

    def main(self, *args, standalone_mode: bool = True, **kwargs):
        # click's overloads of main cannot tell that *args stop short of standalone_mode
        main: Callable[..., Any] = super().main
        if not standalone_mode:
            return main(*args, standalone_mode=False, **kwargs)
        sys.exit(_guarded(lambda: main(*args, standalone_mode=False, **kwargs)))

    def invoke(self, ctx: click.Context):
        try:
            with inputs_scope():  # the files this command reads, which its -o must not replace
                return super().invoke(ctx)
        except PlannerError as exc:
            sys.exit(_error(str(exc), exc.exit_code))
        except PlanError as exc:  # a plan the cost model refuses (e.g. FP8 on a device without it): the input's fault
            sys.exit(_error(str(exc), 2))


# What a failed write to stdout raises (a stream's OSError carries no file name): the reader
# of the pipe or socket gone, a full disk or quota, a closed descriptor, an I/O error, a
# non-blocking descriptor (set so by whoever shares it) that is full.
_OUTPUT_ERRNOS = {
    errno.EPIPE,
    errno.ECONNRESET,
    errno.ENOSPC,
    errno.EDQUOT,
    errno.EFBIG,
    errno.EBADF,
    errno.EIO,
    errno.EAGAIN,
}


class _ClosedOutput:
    """sys.stdout when descriptor 1 was closed (`plan ... >&-`, where Python sets it to None and
    click and rich would drop the output without a word): a write fails as a closed descriptor does."""

    encoding, errors = "utf-8", "strict"

    def write(self, text: str) -> int:
        raise OSError(errno.EBADF, "it is closed")

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def _guarded(command) -> int:
    """Run `command` (click's main, not standalone) and flush its output; the exit code, after at
    most one line on stderr."""
    if sys.stdout is None:
        sys.stdout = _ClosedOutput()
    if sys.stderr is None:  # `2>&-`: messages are dropped (print(file=None) would send them to stdout)
        sys.stderr = open(os.devnull, "w")
    out = sys.stdout  # click swaps in a wrapper that ignores a broken pipe; flush what it wraps
    try:
        try:
            rv = command()
            code = rv if isinstance(rv, int) else 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else _error(str(exc.code), 1)
        out.flush()
        return code
    except click.UsageError as exc:
        command_path = exc.ctx.command_path if exc.ctx is not None else "plan"
        if isinstance(exc, click.exceptions.NoArgsIsHelpError):  # `plan` alone: click's message is the whole help
            return _error(
                f"give a command: {', '.join(sorted(cli.commands))} (`plan --help` says what each does)", exc.exit_code
            )
        return _error(f"{_click_line(exc)} (`{command_path} --help` lists the options)", exc.exit_code)
    except click.ClickException as exc:
        return _error(_click_line(exc), exc.exit_code)
    except (click.Abort, KeyboardInterrupt):
        return _error("interrupted", 130)
    except OSError as exc:
        if exc.errno not in _OUTPUT_ERRNOS or exc.filename is not None:
            raise
        _discard_output(out)
        return 1 if exc.errno == errno.EPIPE else _error(f"cannot write to standard output: {exc.strerror}", 1)
    except UnicodeEncodeError as exc:
        _discard_output(out)
        bad = exc.object[exc.start : exc.end]
        why = (
            "it is not a character (an undecodable byte in a name)"
            if "\ud800" <= bad[0] <= "\udfff"
            else "set PYTHONIOENCODING=utf-8 (or a UTF-8 locale)"
        )
        return _error(f"cannot write {bad!r} in the output's encoding, {exc.encoding}: {why}", 1)


def _click_line(exc: click.ClickException) -> str:
    """click's message on one line: it lays out a choice list over lines ("Choose from:\\n\\t...")
    and quotes the values given with repr, so its own newlines are layout."""
    return " ".join(line.strip() for line in exc.format_message().splitlines() if line.strip())


def _error(message: str, code: int) -> int:
    """Print "error: MESSAGE" as one line on stderr (a full or closed stderr drops it); return `code`."""
    try:
        click.echo(f"error: {printable(message)}", err=True)
    except (OSError, ValueError):
        pass
    return code


def _discard_output(out) -> None:
    """After a failed write: what is still buffered goes to /dev/null, so the interpreter's last
    flush at exit cannot fail (and print "Exception ignored ...") where this one did."""
    try:
        fd = out.fileno()
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)
        os.close(null)
    except (OSError, ValueError, AttributeError):
        pass


@click.group(cls=_Group)
@click.version_option(__version__, prog_name="plan")
def cli() -> None:
    """Plan, estimate, profile and run distributed training layouts (DP x TP x PP)."""


def _register() -> None:
    from planner.cli import estimate, export, presets, profile, run, schema, show, size, solve, tune

    cli.add_command(presets.presets)
    cli.add_command(estimate.estimate)
    cli.add_command(solve.solve)
    cli.add_command(profile.profile)
    cli.add_command(run.run)
    cli.add_command(show.show)
    cli.add_command(export.export)
    cli.add_command(schema.schema)
    cli.add_command(tune.tune)
    cli.add_command(size.size)


_register()


def main() -> None:
    cli(prog_name="plan")


if __name__ == "__main__":
    main()
