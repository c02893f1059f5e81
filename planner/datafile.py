"""Reading specs from JSON/YAML files with safe loaders and one-line errors.

Plans, profiles and presets are data: only ``json.loads`` and ``yaml.safe_load`` are used,
nothing is unpickled or executed.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Callable, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from planner.errors import UsageError

T = TypeVar("T", bound=BaseModel)


def read_mapping(path: Path) -> tuple[dict, str]:
    """Parse a JSON or YAML file into a dict; errors name the file and line."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    try:
        if path.suffix == ".json":
            data = json.loads(text)
        else:
            data = yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path}:{exc.lineno}: malformed JSON: {exc.msg}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UsageError(f"{path}{where}: malformed YAML: {problem}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected a mapping of fields at the top level, got {type(data).__name__}")
    return data, text


def key_line(text: str, key: str) -> int | None:
    """First line where `key` appears as a JSON or YAML key (1-based), for error messages."""
    pat = re.compile(r'^\s*(?:"%s"\s*:|%s\s*:)' % (re.escape(key), re.escape(key)) + "|" + r'"%s"\s*:' % re.escape(key))
    for i, line in enumerate(text.splitlines(), start=1):
        if pat.search(line):
            return i
    return None


def validation_message(exc: ValidationError, path: Path | str | None = None, text: str | None = None) -> str:
    """One line: where the first problem is and what is wrong with it."""
    # An unknown field (a typo) explains the missing one it was meant to be: report it first.
    errors = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
    err = errors[0]
    loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
    line = None
    if text is not None:
        for part in reversed([p for p in err["loc"] if isinstance(p, str)]):
            line = key_line(text, part)
            if line:
                break
    where = f"{path}:{line}" if (path and line) else (str(path) if path else "")
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown field"
    elif err["type"] == "missing":
        msg = "required field is missing"
    more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
    prefix = f"{where}: " if where else ""
    return f"{prefix}field '{loc}': {msg}{more}"


def parse_spec(cls: type[T], data: dict, path: Path | str | None = None, text: str | None = None) -> T:
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise UsageError(validation_message(exc, path, text)) from None


def load_named(
    name_or_path: str,
    kind: str,
    presets: dict[str, Path],
    parse: Callable[[dict, Path, str], T],
) -> T:
    """A preset by name, or a spec file by path. Unknown names list the close matches."""
    if name_or_path in presets:
        data, text = read_mapping(presets[name_or_path])
        return parse(data, presets[name_or_path], text)
    path = Path(name_or_path)
    if path.suffix in (".json", ".yaml", ".yml") or os.sep in name_or_path:
        if not path.exists():
            raise UsageError(f"{kind} file {name_or_path} does not exist")
        data, text = read_mapping(path)
        return parse(data, path, text)
    close = difflib.get_close_matches(name_or_path, list(presets), n=4, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise UsageError(
        f"unknown {kind} preset {name_or_path!r}{hint} (`plan presets` lists them; or give a path to a .json/.yaml file)"
    )


def write_atomic(path: Path | str, text: str) -> None:
    """Write through a temporary file in the same directory, then rename: never a half-written file."""
    path = Path(path)
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.exists():
        raise UsageError(f"cannot write {path}: directory {directory} does not exist")
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise

