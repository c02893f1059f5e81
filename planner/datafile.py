"""Reading specs from JSON/YAML files with safe loaders and one-line errors.

Plans, profiles and presets are data: only ``json.loads`` and a safe YAML loader (libyaml's
CSafeLoader's parser where installed) are used, nothing is unpickled or executed.

Every input file is opened by read_input: only a regular file, opened without blocking and
read at most its limit plus one byte, so a FIFO, a device, a stream or a directory is refused
in one line instead of hanging or filling memory. What it read is recorded (device and inode)
for the command running (inputs_scope), and check_output refuses an `-o` that resolves to any
of those files: a model directory's config.json or a hub-cache blob behind its snapshot link.
"""

from __future__ import annotations

import contextlib
import contextvars
import difflib
import errno
import json
import os
import re
import stat
import tempfile
from pathlib import Path
from typing import Callable, Iterator, Optional, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from planner import specs
from planner.errors import PlannerError, UsageError

T = TypeVar("T", bound=BaseModel)

# A spec, profile or plan file is a few hundred kB at most (`plan solve --top-k 10 --json` for
# DeepSeek-V3: 64 kB, 1,903 values; a Hugging Face config.json: a few kB); nesting is a few
# levels. The bounds keep the worst file of each kind to about a second on a busy 2-core machine,
# where json.loads takes about 2.5 s for 4 MiB of "[]," (1.4 million lists): a JSON file's values
# are first counted from its commas and brackets. YAML is composed node by node in Python (about
# 20 us a node there even over libyaml's parser), so it is bounded by nodes, counted with every
# alias expanded, and by aliases (a spec needs none; a YAML "billion laughs" of 700 bytes expands
# to 10^9 nodes through 90 aliases).
MAX_SPEC_BYTES = 4 * 2**20
MAX_JSON_NODES = 500_000
MAX_YAML_NODES = 50_000
MAX_YAML_ALIASES = 100
MAX_DEPTH = 32
_SPEC = "spec or plan file"  # what read_input reads unless told (its messages say so)
_KINDS = "give a regular .json/.yaml file"
_UNNAMEABLE = "not a name a file can have here (a NUL byte, or a character the file system's encoding lacks)"


# ----- opening: regular files only, bounded, recorded

_READ: contextvars.ContextVar[dict | None] = contextvars.ContextVar("planner_inputs_read", default=None)


@contextlib.contextmanager
def inputs_scope() -> Iterator[None]:
    """Record the files read_input reads until the block ends (one CLI command: planner/cli/main.py),
    for check_output and write_atomic to refuse writing over any of them."""
    token = _READ.set({})
    try:
        yield
    finally:
        _READ.reset(token)


def inputs_read() -> dict:
    """(device, inode) -> path of every file read in the current inputs_scope (none outside one)."""
    return dict(_READ.get() or {})


def read_input(path: Path | str, limit: int = MAX_SPEC_BYTES, what: str = _SPEC) -> bytes:
    """The bytes of a regular file of at most `limit` bytes; anything else one UsageError line.
    Opened with O_NONBLOCK (a FIFO swapped in after the stat cannot block), checked again with
    fstat on the open descriptor, read up to limit + 1 bytes (a file growing meanwhile is caught)."""
    name = os.fspath(path)
    named = name if what == _SPEC else f"the {what} {name}"  # for an OS error's line
    try:
        _refuse_special(name, os.stat(name).st_mode, what)  # before opening: opening a device can itself act
        flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(name, flags)
    except OSError as exc:
        raise UsageError(os_message("read", named, exc)) from None
    except ValueError:  # a NUL byte, or a character no file name here can hold
        raise UsageError(f"cannot read {name!r}: {_UNNAMEABLE}") from None
    try:
        info = os.fstat(fd)
        _refuse_special(name, info.st_mode, what)
        if info.st_size > limit:
            raise UsageError(f"{name}: {info.st_size:,} bytes is too large for a {what} (at most {limit:,})")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(limit + 1 - size, 2**20))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise UsageError(f"{name}: more than {limit:,} bytes is too large for a {what} (at most {limit:,})")
    except OSError as exc:
        raise UsageError(os_message("read", named, exc)) from None
    finally:
        os.close(fd)
    scope = _READ.get()
    if scope is not None:
        scope[(info.st_dev, info.st_ino)] = name
    return b"".join(chunks)


def _refuse_special(name: str, mode: int, what: str) -> None:
    hint = _KINDS if what == _SPEC else f"give the {what}, a regular file"
    if stat.S_ISDIR(mode):
        raise UsageError(f"cannot read {name}: it is a directory; {hint}")
    if not stat.S_ISREG(mode):
        raise UsageError(f"cannot read {name}: it is a {_special(mode)}, not a regular file; {hint}")


def _special(mode: int) -> str:
    return (
        "pipe (FIFO)"
        if stat.S_ISFIFO(mode)
        else "character device"
        if stat.S_ISCHR(mode)
        else "block device"
        if stat.S_ISBLK(mode)
        else "socket"
        if stat.S_ISSOCK(mode)
        else "special file"
    )


def os_message(verb: str, name: str, exc: OSError) -> str:
    """One line for an OS error on a path given by the user, saying what to change."""
    reasons: dict[Optional[int], str] = {
        errno.ENAMETOOLONG: f"a name in the path is too long (at most {NAME_MAX} bytes each); shorten it",
        errno.ELOOP: "a symbolic link loop (too many levels of links); give a path without the loop",
        errno.EACCES: "permission denied",
        errno.ENOTDIR: "a part of the path is not a directory",
        errno.ENXIO: f"it is a socket or a device without a reader; {_KINDS}",
    }
    why = reasons.get(exc.errno)
    if exc.errno == errno.ENOENT:
        dangling = os.path.islink(name)
        why = "a symbolic link to a file that does not exist" if dangling else "no such file"
    return f"cannot {verb} {short_text(name)}: {why or exc.strerror or exc}"


def missing(path: Path | str) -> bool:
    """True only when nothing is at `path` (a dangling link counts as something, for read_input
    to name); a name the OS refuses for another reason (too long, a loop) is left to read_input."""
    try:
        os.lstat(os.fspath(path))
    except OSError as exc:
        return exc.errno in (errno.ENOENT, errno.ENOTDIR)
    except ValueError:
        return False
    return False


# ----- parsing


def read_mapping(path: Path) -> tuple[dict, str]:
    """Parse a JSON or YAML file into a dict; errors name the file and line."""
    raw = read_input(path)
    if path.suffix == ".json" and sum(raw.count(c) for c in (b",", b"[", b"{")) > MAX_JSON_NODES:  # before parsing them
        raise UsageError(
            f"{path}: more than {MAX_JSON_NODES:,} values (counting commas and brackets); not a spec or plan file"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: not a UTF-8 text file (byte {exc.start}); give a JSON or YAML spec") from None
    try:
        data = (
            json.loads(text, parse_constant=_no_constant, object_pairs_hook=_unique_keys)
            if path.suffix == ".json"
            else _load_yaml(path, text)
        )
    except _DuplicateKey as exc:  # JSON would keep the last silently: which one the author meant is not ours to guess
        line = _second_line(text, exc.key)
        raise UsageError(
            f"{path}{f':{line}' if line else ''}: the key {exc.key!r} appears twice in one mapping; keep one"
        ) from None
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
    depth, nodes = _shape(data)
    if nodes > MAX_JSON_NODES:
        raise UsageError(f"{path}: more than {MAX_JSON_NODES:,} values; not a spec or plan file")
    if depth > MAX_DEPTH:
        raise UsageError(f"{path}: nested more than {MAX_DEPTH} levels deep; not a spec or plan file")
    if data is None:  # an empty YAML document (only comments or document markers), or null
        blank = all(
            not ln.strip() or ln.lstrip().startswith(("#", "%")) or re.fullmatch(r"(---|\.\.\.)(\s+#.*)?", ln.strip())
            for ln in text.splitlines()
        )  # comments, directives and document markers
        raise UsageError(f"{path}: {'empty' if blank else 'null'}; expected a mapping of fields")
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected a mapping of fields at the top level, got {type(data).__name__}")
    if _SURROGATE_ESCAPE.search(text):
        _refuse_lone_surrogates(path, data)
    return data, text


# A JSON (\udc80) or YAML (\udc80, \U0000dc80) escape of a UTF-16 surrogate: a pair of them is one
# character, one alone is none, and no output (a terminal, a JSON file) can write it.
_SURROGATE_ESCAPE = re.compile(r"\\(?:u|U0000)[dD][89a-fA-F]")


def _refuse_lone_surrogates(path: Path, data: dict) -> None:
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ord(exc.object[exc.start])
        raise UsageError(
            f"{path}: \\u{code:04x} is half of a UTF-16 surrogate pair, alone, which is not a character; fix the escape"
        ) from None


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number a spec may hold; give a finite value")


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list) -> dict:
    """A JSON object's pairs as a dict, refusing a key given twice (json.loads keeps the last)."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _second_line(text: str, key: str) -> int | None:
    """The line of `key`'s second appearance as a JSON key (1-based), for the message; None
    where the key appears more than twice (other mappings may hold it: which pair repeats is
    not known from the text alone)."""
    hits = [m.start() for m in re.finditer(r'"%s"\s*:' % re.escape(json.dumps(key)[1:-1]), text)]
    return text.count("\n", 0, hits[1]) + 1 if len(hits) == 2 else None


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
    loc = ".".join(str(p) for p in err["loc"])
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
    msg = msg.removeprefix("Value error, ")  # a validator's own sentence, which pydantic prefixes
    if err["type"] == "model_type":  # "... or instance of StageRecompute": a class name means nothing in a file
        cls = getattr(specs, err.get("ctx", {}).get("class_name", ""), None)
        names = getattr(cls, "model_fields", None)
        fields = ""
        if isinstance(names, dict):
            required = [k for k, f in names.items() if f.is_required()]
            if len(names) > 6 and len(required) < len(names):  # a model spec's 34 fields: its required ones say enough
                fields = f" ({', '.join(required)} and {len(names) - len(required)} optional)"
            else:
                fields = f" ({', '.join(names)})"
        msg = f"expected a mapping of fields{fields}, got {short_text(repr(err['input']))}"
    more = ""
    if len(errors) > 1:  # name the others (up to four) so that one edit can fix them all

        def what(e) -> str:
            kind = {"missing": " missing", "extra_forbidden": " unknown"}.get(e["type"], "")
            return f"'{short_text('.'.join(str(p) for p in e['loc']))}'{kind}" if e["loc"] else "a check across fields"

        rest = errors[1:]
        more = (
            f" (also {', '.join(what(e) for e in rest[:4])}"
            + (f" and {len(rest) - 4} more" if len(rest) > 4 else "")
            + ")"
        )
    prefix = f"{where}: " if where else ""
    field_ = f"field '{loc}': " if err["loc"] else ""  # a check across fields names them itself
    return f"{prefix}{field_}{msg}{more}"


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
    if (
        path.suffix in (".json", ".yaml", ".yml") or os.sep in name_or_path or os.path.lexists(name_or_path)
    ):  # a path, even without a suffix
        if missing(path):
            preset = (
                path.stem if path.stem in presets and path.parent == Path(".") else None
            )  # llama3-8b.yaml for llama3-8b
            raise UsageError(
                f"{kind} file {name_or_path} does not exist"
                + (f"; there is a {kind} preset named {preset} (give the name, not a file)" if preset else "")
            )
        data, text = read_mapping(path)
        return parse(data, path, text)
    close = [p for p in presets if name_or_path.lower() in p.lower()][:4] or difflib.get_close_matches(
        name_or_path, list(presets), n=4, cutoff=0.5
    )
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    where = (
        "a path to a .json/.yaml spec, a Hugging Face config.json or model directory, or a hub id in the local cache"
        if kind == "model"
        else "a path to a .json/.yaml file"
    )
    raise UsageError(
        f"unknown {kind} preset {short_text(name_or_path)!r}{hint} (`plan presets` lists them; or give {where})"
    )


# Longest file name most file systems take (NAME_MAX); the temporary name adds to the output's.
NAME_MAX = 255
_TMP_EXTRA = len("..") + len(".tmp") + 8  # mkstemp's "." prefix, random part and suffix


def check_output(output: str | os.PathLike[str], inputs: tuple = ()) -> Path:
    """Refuse, before any work, an output path the atomic write cannot honour: empty, a
    directory, anything not a regular file once its links are followed (a device, a pipe, a
    terminal, /dev/stdout or /proc/self/fd/N whatever they lead to), a link loop, a name too
    long, a missing or unwritable directory, or a file the command reads: one of `inputs`, or
    any file read_input has read in this inputs_scope, compared by device and inode (through
    symlinks and hard links: a model directory's config.json, a hub-cache blob behind its
    snapshot link). Returns the path that will be written (a symlink's target: writes go through links)."""
    if output is None or str(output).strip() == "":
        raise UsageError("-o needs a file name")
    if str(output) == "-":  # not a file named '-': a reader would take it for standard output
        raise UsageError("-o -: -o writes a file; for the document on standard output use --json (or leave -o out)")
    name = os.fspath(output)
    longest = max((len(part.encode("utf-8", "surrogatepass")) for part in name.split(os.sep)), default=0)
    if longest > NAME_MAX:
        raise UsageError(
            f"cannot write {short_text(name)}: a name in the path is {longest} bytes, more than {NAME_MAX}; shorten it"
        )
    try:
        info = os.stat(name)
    except FileNotFoundError:
        info = None  # a new file, or a link to one
    except OSError as exc:
        raise UsageError(os_message("write", name, exc)) from None
    except ValueError:
        raise UsageError(f"cannot write {name!r}: {_UNNAMEABLE}") from None
    if _through_proc(name):
        raise UsageError(
            f"cannot write {name}: it is a process's stream (/proc, /dev/stdout, /dev/fd); give a file name"
        )
    if name.endswith((os.sep, os.sep + ".", os.sep + "..")) or name in (".", ".."):
        # a directory's name (POSIX: a trailing slash names a directory); realpath would drop it and write NAME
        raise UsageError(f"cannot write {name}: a name ending in '{os.sep}' is a directory's; give a file name")
    target = Path(os.path.realpath(name))
    if info is not None:
        if stat.S_ISDIR(info.st_mode):
            raise UsageError(f"cannot write {name}: it is a directory; give a file name")
        if not stat.S_ISREG(info.st_mode):
            raise UsageError(
                f"cannot write {name}: it is not a regular file (a {_special(info.st_mode)}); give a file name"
            )
        read = {**_stat_keys(inputs), **inputs_read()}
        if (info.st_dev, info.st_ino) in read:
            source = read[(info.st_dev, info.st_ino)]
            which = (
                "of this command" if os.path.abspath(source) == os.path.abspath(name) else f"{source} (the same file)"
            )
            raise UsageError(f"cannot write {name}: it is the input {which}; give another output file")
        if not os.access(
            name, os.W_OK
        ):  # the rename would replace it: honour its read-only mode as an in-place write would
            raise UsageError(
                f"cannot write {name}: the file is read-only; make it writable or give another output file"
            )
    directory = target.parent
    if not directory.is_dir():
        raise UsageError(f"cannot write {name}: directory {directory} does not exist")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write {name}: directory {directory} is not writable")
    size = len(target.name.encode("utf-8", "surrogatepass"))
    if size + _TMP_EXTRA > NAME_MAX:
        raise UsageError(f"cannot write {name}: the file name is too long ({size} bytes); shorten it")
    return target


def short_text(name: str) -> str:
    """`name` as an error line echoes it: whole up to 80 characters, else its first 40 and last 20."""
    return name if len(name) <= 80 else name[:40] + "..." + name[-20:]


def _stat_keys(paths: tuple) -> dict:
    """(device, inode) -> path of those of `paths` that are files now (a preset name is none)."""
    keys = {}
    for item in paths:
        try:
            info = os.stat(item) if item else None
        except (OSError, ValueError):
            continue
        if info is not None and stat.S_ISREG(info.st_mode):
            keys[(info.st_dev, info.st_ino)] = os.fspath(item)
    return keys


def _through_proc(name: str) -> bool:
    """Whether `name`, or a link it leads through, is a process's file descriptor (/proc/PID/fd/N,
    /dev/fd/N, /dev/stdout): the real path of those names the file behind the descriptor, which
    may be a regular file another program is writing."""
    path = os.path.abspath(name)
    for _ in range(40):  # the kernel's own limit on links followed in one lookup
        where = os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
        if where.startswith(("/proc/", "/dev/fd/")):
            return True
        try:
            path = os.path.normpath(os.path.join(os.path.dirname(where), os.readlink(where)))
        except OSError:  # not a link (or nothing there): the name is what it is
            return False
    return False


def write_atomic(path: str | os.PathLike[str], text: str | bytes) -> None:
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


# ----- the depth and size of what was parsed


def _shape(data) -> tuple[int, int]:
    """Nesting depth of lists and mappings and the number of values, each counted up to just
    past its limit (iteratively: no recursion; YAML's aliases bounded already by _load_yaml)."""
    deepest, nodes, stack = 0, 1, [(data, 1)]
    while stack:
        item, d = stack.pop()
        if isinstance(item, (dict, list)):
            deepest, nodes = max(deepest, d), nodes + len(item)
            if deepest > MAX_DEPTH or nodes > MAX_JSON_NODES:
                break
            stack.extend((v, d + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest, nodes


# ----- YAML, bounded before anything walks the expanded document


class _YAMLTooLarge(yaml.YAMLError):
    """A document past MAX_YAML_NODES or MAX_YAML_ALIASES (its message says which)."""


class _CountingComposer(yaml.composer.Composer):
    """PyYAML's composer, counting nodes and aliases as they are parsed: a document past the
    bounds is refused after at most MAX_YAML_NODES nodes are built."""

    def __init__(self) -> None:
        yaml.composer.Composer.__init__(self)
        self.nodes, self.aliases = 0, 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_YAML_ALIASES:
                raise _YAMLTooLarge(f"more than {MAX_YAML_ALIASES} aliases (*name); a spec or plan needs none")
        else:
            self.nodes += 1
            if self.nodes > MAX_YAML_NODES:
                raise _YAMLTooLarge(f"more than {MAX_YAML_NODES:,} values; not a spec or plan file")
        return super().compose_node(parent, index)


if getattr(yaml, "__with_libyaml__", False):

    class _YAMLLoader(_CountingComposer, yaml.CSafeLoader):
        """libyaml's parser (C), our composer (counting), PyYAML's safe constructor."""

        def __init__(self, stream) -> None:
            yaml.CSafeLoader.__init__(self, stream)
            _CountingComposer.__init__(self)
else:  # PyYAML built without libyaml: the pure-Python parser, the same bounds

    class _YAMLLoader(_CountingComposer, yaml.SafeLoader):  # type: ignore[no-redef]
        def __init__(self, stream) -> None:
            yaml.SafeLoader.__init__(self, stream)
            _CountingComposer.__init__(self)


def _construct_unique_mapping(loader, node, deep=False):
    """PyYAML's mapping, refusing a key given twice (PyYAML keeps the last) at the line of the
    second; merge keys (<<) are left to PyYAML, whose explicit keys override merged ones."""
    seen: set = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            repeated = key in seen
        except TypeError:  # an unhashable key: PyYAML's own check refuses it
            continue
        if repeated:
            raise yaml.constructor.ConstructorError(
                None, None, f"the key {key!r} appears twice in one mapping; keep one", key_node.start_mark
            )
        seen.add(key)
    return yaml.constructor.SafeConstructor.construct_mapping(loader, node, deep=deep)


# PyYAML's mapping constructor replaced on our loader class, as PyYAML's own loaders are built
_YAMLLoader.construct_mapping = _construct_unique_mapping  # type: ignore[method-assign]


# YAML 1.2's core schema (https://yaml.org/spec/1.2.2/, 10.3.2) in place of PyYAML's YAML 1.1
# resolvers, whose readings a spec's author does not mean: `1:30` is 90 (base 60), `010` is 8
# (octal), `0b11` and `1_000` numbers, `yes` / `no` / `on` / `off` booleans, `2026-12-04` a date,
# while `1e15` is a string. Under 1.2 `010` is 10, `1e15` the float, and the rest are strings,
# which a field that wants a number or a yes/no refuses in one line. Merge keys (<<) stay.
_YAMLLoader.yaml_implicit_resolvers = {}
for _tag, _pattern, _first in (
    ("bool", r"^(?:true|True|TRUE|false|False|FALSE)$", "tTfF"),
    ("int", r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", "-+0123456789"),  # before float: "10" is both
    (
        "float",
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
        "-+0123456789.",
    ),
    ("null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
    ("merge", r"^<<$", "<"),
):
    _YAMLLoader.add_implicit_resolver(f"tag:yaml.org,2002:{_tag}", re.compile(_pattern), list(_first))


def _construct_int(loader, node) -> int:
    """A YAML 1.2 integer: decimal (leading zeros too: `010` is 10), 0o octal, 0x hexadecimal;
    anything else, an explicit `!!int` tag's text included (`+-5`, `1_0`), refused."""
    text = loader.construct_scalar(node)
    m = _YAML_INT.fullmatch(text)
    if m is None:
        raise yaml.constructor.ConstructorError(
            None, None, f"{text!r} is not an integer (decimal, 0o octal or 0x hex)", node.start_mark
        )
    sign, octal, hexadecimal, decimal = m.groups()
    value = (
        int(octal, 8) if octal else int(hexadecimal, 16) if hexadecimal else int(decimal)
    )  # ValueError past 4,300 digits
    return -value if sign == "-" else value


_YAML_INT = re.compile(r"([-+]?)(?:0o([0-7]+)|0x([0-9a-fA-F]+)|([0-9]+))")
_YAMLLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def _load_yaml(path: Path, text: str):
    """yaml.safe_load with bounds: the composed node graph is checked (its size with every alias
    expanded, no alias inside its own anchor) before a Python object is constructed from it."""
    loader = _YAMLLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(path, node)
        return loader.construct_document(node)
    except _YAMLTooLarge as exc:
        raise UsageError(f"{path}: {exc}") from None
    finally:
        loader.dispose()


def _expanded_size(path: Path, root: yaml.Node) -> int:
    """Nodes of the document with aliases expanded, computed once per shared node (memoized
    post-order walk), so a "billion laughs" costs its composed size, not its expansion."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:  # scalars count 1 and are never pushed
        node, finished = stack.pop()
        key = id(node)
        if finished:
            open_.discard(key)
            sizes[key] = 1 + sum(sizes.get(id(k), 1) for k in _children(node))
            if sizes[key] > MAX_YAML_NODES:
                raise UsageError(
                    f"{path}: more than {MAX_YAML_NODES:,} values once its aliases are expanded; "
                    "not a spec or plan file"
                )
        elif key in open_:
            raise UsageError(f"{path}: an alias refers to the collection it is in; a spec or plan is not recursive")
        elif key not in sizes:
            open_.add(key)
            stack.append((node, True))
            stack.extend((k, False) for k in _children(node) if not isinstance(k, yaml.ScalarNode))
    return sizes.get(id(root), 1)


def _children(node: yaml.Node) -> list:
    if isinstance(node, yaml.SequenceNode):
        return node.value
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []
