"""Property-based test: mutated scenarios never crash the command line.

Whatever hypothesis does to a valid scenario — drops keys, swaps in wrong types,
out-of-range or non-dividing values — `stepsim run` ends with exit 0 and a
summary, or exit 2 and one message naming a field; never a traceback (exit 1)
and never a hang.
"""

from __future__ import annotations

import copy
import signal

import pytest
import yaml
from helpers import scenario
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.cli.app import main

BASE = scenario(
    cluster={"preset": "dgx-h100", "devices": 8},
    parallel={"tp": 2, "pp": 2, "dp": 2, "zero": 1},
    training={"seq_len": 512, "micro_batch_size": 1, "global_batch_size": 8},
)


def _paths(d, prefix=()):
    for k, v in d.items():
        yield prefix + (k,)
        if isinstance(v, dict):
            yield from _paths(v, prefix + (k,))


PATHS = list(_paths(BASE))

WEIRD = st.one_of(
    st.none(),
    st.booleans(),
    st.text(max_size=6),
    st.integers(-3, 9),
    st.sampled_from([0, 3, 5, 7, 10**12]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.lists(st.integers(0, 3), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)

MUTATION = st.tuples(st.sampled_from(PATHS), st.sampled_from(["drop", "replace"]), WEIRD)


def _apply(sc, mutation):
    path, kind, value = mutation
    node = sc
    for k in path[:-1]:
        if not isinstance(node, dict) or k not in node:
            return
        node = node[k]
    if not isinstance(node, dict):
        return
    if kind == "drop":
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout()


def _run_exits_0_or_2(args, capsys, what) -> tuple[int, str]:
    """``stepsim ARGS`` in-process under a 60 s alarm: exit 0, or exit 2 with one error
    line and no traceback. Returns the exit code and stdout."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(60)
    try:
        code = main(args)
    except _Timeout:
        raise AssertionError(f"hang (> 60 s) on {what}") from None
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    out, err = capsys.readouterr()
    assert code in (0, 2), f"exit {code} for {what}: {err}"
    assert "Traceback" not in err
    if code == 2:
        assert err.startswith("stepsim: error:") and len(err.strip().splitlines()) == 1, err
    return code, out


@pytest.mark.slow
@settings(
    max_examples=int(__import__("os").environ.get("STEPSIM_FUZZ_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(mutations=st.lists(MUTATION, min_size=1, max_size=3))
def test_mutated_scenarios_exit_0_or_2(tmp_path_factory, capsys, mutations):
    sc = copy.deepcopy(BASE)
    for m in mutations:
        _apply(sc, m)
    p = tmp_path_factory.mktemp("fuzz") / "s.yaml"
    p.write_text(yaml.safe_dump(sc))
    code, out = _run_exits_0_or_2(["run", str(p), "--json"], capsys, sc)
    if code == 0:
        assert '"step_time_s"' in out


# ---- the YAML text itself ------------------------------------------------------------------

BASE_TEXT = yaml.safe_dump(BASE, sort_keys=False).encode()
NASTY = [
    b"\t",
    b":",
    b"{",
    b"[",
    b"]",
    b"&a ",
    b"*a",
    b"- ",
    b"\n",
    b"'",
    b'"',
    b"#",
    b"\x00",
    b"\xff",
    b"\xe9",
    b"!!python/object:os.system ",
    b"<<: ",
    b"---\n",
    b"model: llama3-8b\n",
    b"5e9",
    b".nan",
    b"~",
    b"%YAML 1.1\n",
]

EDIT = st.tuples(
    st.integers(0, len(BASE_TEXT)), st.integers(0, 4), st.one_of(st.sampled_from(NASTY), st.binary(max_size=3))
)


@pytest.mark.slow
@settings(
    max_examples=int(__import__("os").environ.get("STEPSIM_FUZZ_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(edits=st.lists(EDIT, min_size=1, max_size=3))
def test_mangled_yaml_text_exits_0_or_2(tmp_path_factory, capsys, edits):
    """Byte-level edits of a valid scenario file (tabs, brackets, anchors, NULs, invalid
    UTF-8, tags, a second document, a duplicate key): exit 0, or exit 2 with one line."""
    text = BASE_TEXT
    for pos, cut, insert in edits:
        text = text[:pos] + insert + text[pos + cut :]
    p = tmp_path_factory.mktemp("fuzz") / "mangled.yaml"
    p.write_bytes(text)
    _run_exits_0_or_2(["run", str(p), "--json", "--no-plots"], capsys, repr(text))


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(
    x=st.floats(min_value=1e-12, max_value=1e15, allow_nan=False, allow_infinity=False),
    style=st.sampled_from(["{:e}", "{:E}", "{:g}", "{:.3e}", "{!r}"]),
    sign=st.sampled_from(["", "-", "+"]),
)
def test_yaml_numbers_in_any_notation_are_floats(x, style, sign):
    """YAML 1.2 floats (issue 14 item 2): 5e9, 1E-6, 6.25e+09, 1e-06, ... read as the number
    Python's float() gives for the same text; PyYAML's YAML 1.1 rules read 5e9 as a string."""
    from stepsim_fileio import load_yaml

    text = sign + style.format(x)
    value = load_yaml(f"v: {text}\n")["v"]
    assert isinstance(value, (int, float)) and not isinstance(value, bool)
    assert value == float(text)
