"""Reading input files safely: one YAML loader and one capped text reader for every file.

Every file stepsim reads (scenario, sweep, cluster, topology, trace, Hugging Face
``config.json``) goes through :func:`read_text` (or :func:`read_bytes`), and every
YAML document through :func:`load_yaml`:

* only a regular file is read: a directory, a FIFO (which would block), a device
  (``/dev/zero``), a socket, a broken link or a symbolic-link loop is refused at once,
  saying which it is (:func:`check_regular_file`);
* at most ``limit_bytes`` are read (16 MiB by default; traces and topologies
  allow more), so a runaway file is refused, not slurped;
* binary input (a NUL byte, or bytes that are not UTF-8) is refused naming the file;
  UTF-16 and UTF-32 text (a byte-order mark, or a NUL beside every ASCII character) is
  named as such; a UTF-8 byte-order mark is skipped;
* YAML numbers follow YAML 1.2: ``5e9``, ``1e-6``, ``6.25e9``, ``.5`` and
  ``-1E3`` are floats (PyYAML's YAML 1.1 rules read ``5e9`` as the string ``'5e9'``);
* a key given twice in one mapping is refused, naming the key and its line;
* aliases may not expand to more than :data:`MAX_YAML_NODES` nodes (the
  "billion laughs" alias bomb) and nesting may not be deeper than
  :data:`MAX_YAML_DEPTH` levels;
* a syntax error is reported as ``FILE:LINE:COLUMN: problem``.

Every refusal is an :class:`InputFileError` (a ``ValueError``; the CLI exits 2)
whose message starts with the file name.
"""

from __future__ import annotations

import codecs
import errno
import gzip
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

from stepsim_errors import StepsimError

DEFAULT_LIMIT_BYTES = 16 * 2**20  # scenario, sweep, cluster and config.json files
MAX_YAML_NODES = 1_000_000  # nodes after alias expansion (a 16 MiB file has fewer)
MAX_YAML_DEPTH = 64  # nesting levels (a scenario needs 4)
MAX_JSON_DEPTH = 64


class InputFileError(StepsimError):
    """An input file that cannot be read as what it should be; ``field`` names the file."""

    def __init__(self, message: str, *, path: str | Path, field: str | None = None) -> None:
        self.path = str(path)
        super().__init__(f"{path}: {message}", field=field)


def _fmt_size(n: int) -> str:
    return f"{n / 2**20:g} MiB" if n >= 2**20 else f"{n:,} bytes"


_NOT_REGULAR = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def is_there(path: str | Path) -> bool:
    """Whether something is at ``path`` to read, or to refuse by name when read: a file or folder,
    a broken link or a link loop, or a name the file system refuses (longer than it allows;
    ``Path.exists`` raises there, :func:`check_regular_file` says why)."""
    p = Path(path)
    try:
        return p.exists() or p.is_symlink()
    except OSError:
        return True


def is_folder(path: str | Path) -> bool:
    """``Path.is_dir``, False for a name the file system refuses (reading it says why)."""
    try:
        return Path(path).is_dir()
    except OSError:
        return False


def check_regular_file(path: str | Path, what: str = "file") -> None:
    """Refuse, naming ``path``, anything but a regular file (or a link to one): a missing
    file, a broken link, a symbolic-link loop, a directory, a FIFO, a device or a socket.
    Checked before opening, so a FIFO never blocks and ``/dev/zero`` is never read."""
    p = Path(path)
    try:
        mode = os.stat(p).st_mode
    except ValueError:  # a NUL character in the name
        raise InputFileError(f"not a valid file name (a NUL character), not a {what}", path=repr(str(p))) from None
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise InputFileError(
                f"a symbolic-link loop (a link that leads back to itself), not a {what}", path=p
            ) from None
        if err.errno == errno.ENOENT:
            broken = os.path.islink(p)
            raise InputFileError(
                f"cannot read {what}: " + ("a broken symbolic link" if broken else "no such file"), path=p
            ) from None
        raise InputFileError(f"cannot read {what}: {err.strerror or err}", path=p) from None
    for test, kind in _NOT_REGULAR:
        if test(mode):
            raise InputFileError(f"is {kind}, not a regular file; a {what} must be a regular file", path=p)


def read_bytes(path: str | Path, limit_bytes: int = DEFAULT_LIMIT_BYTES, what: str = "file") -> bytes:
    """At most ``limit_bytes`` of the regular file ``path`` (gunzipped when it ends in
    ``.gz``); larger, or not a regular file (:func:`check_regular_file`), is refused."""
    p = Path(path)
    check_regular_file(p, what)
    try:
        opener = gzip.open if p.suffix == ".gz" else open
        with opener(p, "rb") as f:
            data = f.read(limit_bytes + 1)
    except InputFileError:
        raise
    except (OSError, EOFError) as err:  # gzip.BadGzipFile is an OSError
        raise InputFileError(f"cannot read {what}: {getattr(err, 'strerror', None) or err}", path=p) from None
    if len(data) > limit_bytes:
        raise InputFileError(f"{what} larger than the {_fmt_size(limit_bytes)} limit; is this the right file?", path=p)
    return data


def read_text(path: str | Path, limit_bytes: int = DEFAULT_LIMIT_BYTES, what: str = "file") -> str:
    """The UTF-8 text of ``path`` (see :func:`read_bytes`); binary input is refused naming the file."""
    data = read_bytes(path, limit_bytes, what)
    wide = _utf16_or_32(data)
    if wide:
        raise InputFileError(f"{wide} text; a {what} must be UTF-8 (re-save it as UTF-8)", path=path)
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8) :]
    nul = data.find(b"\0")
    if nul >= 0:
        raise InputFileError(f"binary data (a NUL byte at offset {nul:,}), not a text {what}", path=path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputFileError(
            f"not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start:,}); a {what} must be UTF-8 text",
            path=path,
        ) from None


def _utf16_or_32(data: bytes) -> str:
    """``"UTF-16"`` / ``"UTF-32"`` (with the byte order) when ``data`` starts with its
    byte-order mark, or has a NUL beside every character of its first line as ASCII text
    written in UTF-16 has; else ``""``."""
    for bom, name in (
        (codecs.BOM_UTF32_LE, "UTF-32 (little-endian)"),
        (codecs.BOM_UTF32_BE, "UTF-32 (big-endian)"),
        (codecs.BOM_UTF16_LE, "UTF-16 (little-endian)"),
        (codecs.BOM_UTF16_BE, "UTF-16 (big-endian)"),
    ):
        if data.startswith(bom):
            return name
    head = data[:64]
    if len(head) >= 4 and len(head) % 2 == 0:
        if not any(head[1::2]) and all(head[0::2]):
            return "UTF-16 (little-endian, no byte-order mark)"
        if not any(head[0::2]) and all(head[1::2]):
            return "UTF-16 (big-endian, no byte-order mark)"
    return ""


# ---- YAML -------------------------------------------------------------------------------

_FLOAT_TAG = "tag:yaml.org,2002:float"
# YAML 1.2 core schema floats (plus '_' digit separators as PyYAML allows): 1.5, .5, 1.,
# 5e9, -1E3, 6.25e+9, .inf, .nan. YAML 1.1 needs a dot and a signed exponent (1.0e+9).
_FLOAT_RE = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*\.[0-9_]*|\.[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)?
                            |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
                            |[-+]?\.(?:inf|Inf|INF)
                            |\.(?:nan|NaN|NAN))$""",
    re.X,
)


class _Loader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 floats, duplicate keys refused, and depth / expansion caps."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                mark = self.peek_event().start_mark
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_YAML_DEPTH} levels", mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:
                    continue  # unhashable: construct_mapping refuses it below
                if first is not None:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r} (first given on line {first.line + 1})", key_node.start_mark
                    )
                seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


_Loader.yaml_implicit_resolvers = {
    first: [(tag, _FLOAT_RE if tag == _FLOAT_TAG else regexp) for tag, regexp in resolvers]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
for _ch in "-+0123456789.":
    _lst = _Loader.yaml_implicit_resolvers.setdefault(_ch, [])
    if not any(tag == _FLOAT_TAG for tag, _ in _lst):
        _lst.insert(0, (_FLOAT_TAG, _FLOAT_RE))


def _expanded_nodes(root, limit: int) -> int:
    """Nodes of the document with every alias expanded (memoised, so an alias bomb is cheap to count)."""
    memo: dict[int, int] = {}

    def count(node) -> int:
        key = id(node)
        if key in memo:
            if memo[key] < 0:
                raise yaml.composer.ComposerError(
                    None, None, "recursive alias (a value that contains itself)", node.start_mark
                )
            return memo[key]
        memo[key] = -1  # in progress: meeting it again below means a recursive alias
        n = 1
        if isinstance(node, yaml.SequenceNode):
            n += sum(count(c) for c in node.value)
        elif isinstance(node, yaml.MappingNode):
            n += sum(count(k) + count(v) for k, v in node.value)
        memo[key] = n = min(n, limit + 1)
        return n

    return count(root) if root is not None else 0


def _mark(err: yaml.MarkedYAMLError) -> str:
    mark = err.problem_mark or err.context_mark
    return f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""


def load_yaml(text: str, name: str = "<string>") -> Any:
    """Parse one YAML document with :class:`_Loader`; every refusal names ``name`` (and line:column)."""
    loader = None
    try:
        loader = _Loader(text)
        root = loader.get_single_node()
        if root is None:
            return None
        n = _expanded_nodes(root, MAX_YAML_NODES)
        if n > MAX_YAML_NODES:
            raise InputFileError(
                f"YAML aliases expand to more than {MAX_YAML_NODES:,} nodes (an alias bomb?); write the values out",
                path=name,
            )
        return loader.construct_document(root)
    except yaml.MarkedYAMLError as err:
        problem = err.problem or err.context or "invalid YAML"
        if err.problem and err.context:
            problem += f" ({err.context})"
        raise InputFileError(f"not valid YAML: {problem}", path=f"{name}{_mark(err)}") from None
    except yaml.reader.ReaderError as err:  # a non-printable character
        raise InputFileError(
            f"not valid YAML: character {err.character!r} at offset {err.position:,} is not allowed (binary data?)",
            path=name,
        ) from None
    except yaml.YAMLError as err:
        raise InputFileError(f"not valid YAML: {str(err).splitlines()[0]}", path=name) from None
    except RecursionError:
        raise InputFileError(f"YAML nested too deeply (at most {MAX_YAML_DEPTH} levels)", path=name) from None
    finally:
        if loader is not None:
            loader.dispose()


def load_json(text: str, name: str = "<string>") -> Any:
    """``json.loads`` with errors naming ``name``, line and column, and a depth limit."""
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates)
    except _DuplicateKey as err:
        raise InputFileError(f"not valid JSON: duplicate key {err.args[0]!r}", path=name) from None
    except json.JSONDecodeError as err:
        raise InputFileError(f"not valid JSON: {err.msg}", path=f"{name}:{err.lineno}:{err.colno}") from None
    except RecursionError:
        raise InputFileError(f"JSON nested too deeply (at most {MAX_JSON_DEPTH} levels)", path=name) from None
    if _depth(data) > MAX_JSON_DEPTH:
        raise InputFileError(f"JSON nested too deeply (at most {MAX_JSON_DEPTH} levels)", path=name)
    return data


class _DuplicateKey(Exception):
    pass


def _no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


def _depth(obj, level: int = 1) -> int:
    stack = [(obj, level)]
    deepest = 0
    while stack:
        o, lv = stack.pop()
        deepest = max(deepest, lv)
        if lv > MAX_JSON_DEPTH:
            return lv
        if isinstance(o, dict):
            stack.extend((v, lv + 1) for v in o.values())
        elif isinstance(o, list):
            stack.extend((v, lv + 1) for v in o)
    return deepest


def load_file(
    path: str | Path, limit_bytes: int = DEFAULT_LIMIT_BYTES, what: str = "file", fmt: str | None = None
) -> Any:
    """Read and parse ``path``: JSON for ``.json`` / ``.json.gz`` (or ``fmt='json'``), else YAML."""
    p = Path(path)
    text = read_text(p, limit_bytes, what)
    if fmt is None:
        suffixes = [s.lower() for s in p.suffixes[-2:]]
        fmt = "json" if suffixes[-1:] == [".json"] or suffixes == [".json", ".gz"] else "yaml"
    return load_json(text, str(p)) if fmt == "json" else load_yaml(text, str(p))
