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

from planner.errors import PlannerError, UsageError

T = TypeVar("T", bound=BaseModel)


def read_mapping(path: Path) -> tuple[dict, str]:
    """Parse a JSON or YAML file into a dict; errors name the file and line."""
    if path.is_dir():
        raise UsageError(f"cannot read {path}: it is a directory; give a .json/.yaml file")
    try:
        if path.stat().st_size > MAX_SPEC_BYTES:
            raise UsageError(f"{path}: {path.stat().st_size:,} bytes is too large for a spec or plan file (at most {MAX_SPEC_BYTES:,})")
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: not a UTF-8 text file (byte {exc.start}); give a JSON or YAML spec") from None
    try:
        if path.suffix == ".json":
            data = json.loads(text, parse_constant=_no_constant)
        else:
            data = yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path}:{exc.lineno}: malformed JSON: {exc.msg}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UsageError(f"{path}{where}: malformed YAML: {problem}") from None
    except RecursionError:
        raise UsageError(f"{path}: nested too deeply to be a spec or plan file") from None
    except ValueError as exc:  # e.g. an integer of thousands of digits, NaN / Infinity literals
        why = str(exc).splitlines()[0]
        if "digits" in why:
            why = "a number with thousands of digits; no field of a spec or plan is that large"
        raise UsageError(f"{path}: {why}") from None
    if _depth(data) > MAX_DEPTH:
        raise UsageError(f"{path}: nested more than {MAX_DEPTH} levels deep; not a spec or plan file")
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected a mapping of fields at the top level, got {type(data).__name__}")
    return data, text


# A spec, profile or plan file is a few hundred kB at most; nesting is a few levels.
MAX_SPEC_BYTES = 64 * 2**20
MAX_DEPTH = 32


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number a spec may hold; give a finite value")


def _depth(data, limit: int = MAX_DEPTH + 1) -> int:
    """Nesting depth of lists and mappings, counted up to `limit` (iteratively: no recursion)."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        item, d = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, d)
            if deepest >= limit:
                return deepest
            stack.extend((v, d + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


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
    close = [p for p in presets if name_or_path.lower() in p.lower()][:4] or difflib.get_close_matches(name_or_path, list(presets), n=4, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    where = ("a path to a .json/.yaml spec, a Hugging Face config.json or model directory, or a hub id in the local cache"
             if kind == "model" else "a path to a .json/.yaml file")
    raise UsageError(f"unknown {kind} preset {name_or_path!r}{hint} (`plan presets` lists them; or give {where})")


# Longest file name most file systems take (NAME_MAX); the temporary name adds to the output's.
NAME_MAX = 255
_TMP_EXTRA = len("..") + len(".tmp") + 8  # mkstemp's "." prefix, random part and suffix


def check_output(output: Path | str, inputs: tuple = ()) -> Path:
    """Refuse, before any work, an output path the atomic write cannot honour: empty, a
    directory, a device or anything not a regular file, one of the command's inputs, a
    missing or unwritable directory, or a name too long once the temporary suffix is added.
    Returns the path that will be written (a symlink's target: writes go through links)."""
    if output is None or str(output).strip() == "":
        raise UsageError("-o needs a file name")
    path = Path(output)
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    if target.exists():
        if target.is_dir():
            raise UsageError(f"cannot write {output}: it is a directory; give a file name")
        if not target.is_file():
            raise UsageError(f"cannot write {output}: it is not a regular file (a device, pipe or socket); give a file name")
        for item in inputs:
            if item and Path(item).exists() and os.path.samefile(target, item):
                raise UsageError(f"cannot write {output}: it is the input {item}; give another output file")
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise UsageError(f"cannot write {output}: directory {directory} does not exist")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write {output}: directory {directory} is not writable")
    if len(target.name.encode()) + _TMP_EXTRA > NAME_MAX:
        raise UsageError(f"cannot write {output}: the file name is too long ({len(target.name.encode())} bytes); shorten it")
    return target


def write_atomic(path: Path | str, text: str | bytes) -> None:
    """Write through a temporary file in the same directory, then rename: never a half-written
    file. Writes through a symlink to its target; a new file gets the umask's permissions, an
    existing one keeps its own. An OS error (read-only, permission, disk full) becomes one
    line (PlannerError, exit 1) and leaves the old file as it was."""
    target = check_output(path)
    directory = target.parent if str(target.parent) else Path(".")
    try:
        mode = target.stat().st_mode & 0o7777 if target.exists() else 0o666 & ~_umask()
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as exc:
        raise PlannerError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except OSError as exc:
        _discard(tmp)
        raise PlannerError(f"cannot write {path}: {exc.strerror or exc}") from None
    except BaseException:
        _discard(tmp)
        raise


def _discard(tmp: str) -> None:
    try:
        os.unlink(tmp)
    except OSError:
        pass


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
