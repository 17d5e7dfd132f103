"""The two processes of a sandboxed test run (``sandbox.run_tests``). Standard library only:
this file's text is run with ``python -I -c`` inside the sandbox, where the package is not
visible. docs/executors.md ("Code reward") gives the protocol and its threat model.

- ``program`` (uid P): imports the untrusted program as the module ``solution`` (never
  ``__main__``) from source read from an inherited fd, announces its top-level callables,
  then answers calls ``{"call": name, "args": ..., "kwargs": ...}`` with the return value
  encoded as plain built-in data, or the exception's type name and message.
- ``tests`` (uid T ≠ P): reads the hidden tests, the entry point and the run's sentinel from
  its own inherited fd, runs the tests with every program callable replaced by a proxy that
  calls into the program process, and writes the sentinel to its result fd only after the
  tests (and ``check(candidate)``) returned normally. It never runs untrusted code: the
  program can neither change its namespace or builtins nor read its memory (another uid).
"""

from __future__ import annotations

import builtins
import json
import os
import sys
import types

_TAGS = ("t", "d", "s", "fs", "b", "c")
PR_SET_DUMPABLE = 4


_PLAIN = {
    bool: bool,
    int: int.__int__,
    float: float.__float__,
    str: str.__str__,
    bytes: bytes,
    complex: complex.__complex__,
    list: list,
    tuple: tuple,
    dict: dict,
    set: set,
    frozenset: frozenset,
}
"""Each plain type and how an instance of a subclass becomes the plain value (checked in this
order: ``bool`` before ``int``)."""


def encode(value: object) -> object:
    """``value`` as JSON data. An instance of a subclass of a plain type crosses as the plain
    value (``Counter`` → dict, a namedtuple → tuple, ``IntEnum`` → int): what arrives has
    the built-in type and the built-in ``__eq__``. Anything else cannot cross."""
    if value is None:
        return None
    kind = type(value)
    if kind not in _PLAIN:
        kind = next((k for k in _PLAIN if isinstance(value, k)), None)
        if kind is None:
            name = type(value).__name__
            raise TypeError(f"a value of type {name} cannot cross the sandbox boundary")
        value = _PLAIN[kind](value)
    if kind in (bool, int, float, str):
        return value
    if kind is list:
        return [encode(v) for v in value]
    if kind is tuple:
        return {"t": [encode(v) for v in value]}
    if kind is dict:
        return {"d": [[encode(k), encode(v)] for k, v in value.items()]}
    if kind in (set, frozenset):
        return {"s" if kind is set else "fs": [encode(v) for v in value]}
    if kind is bytes:
        return {"b": value.hex()}
    return {"c": [value.real, value.imag]}


def decode(data: object) -> object:
    """The inverse of ``encode`` for data from ``json.loads``; anything else is an error."""
    if data is None or type(data) in (bool, int, float, str):
        return data
    if type(data) is list:
        return [decode(v) for v in data]
    if type(data) is not dict or len(data) != 1 or next(iter(data)) not in _TAGS:
        raise ValueError("malformed value from the other sandbox process")
    tag, body = next(iter(data.items()))
    if tag == "b":
        return bytes.fromhex(body)
    if type(body) is not list:
        raise ValueError("malformed value from the other sandbox process")
    if tag == "d":
        return {decode(k): decode(v) for k, v in body}
    if tag == "c":
        return complex(float(body[0]), float(body[1]))
    items = [decode(v) for v in body]
    return {"t": tuple, "s": set, "fs": frozenset}[tag](items)


READY = b"ready\n"
"""The tests process's first line to the program process: it may import the program now."""


def _send(stream: object, message: dict) -> None:
    stream.write(json.dumps(message).encode() + b"\n")  # type: ignore[attr-defined]
    stream.flush()  # type: ignore[attr-defined]


def _read_fd(fd: int) -> bytes:
    with os.fdopen(fd, "rb") as f:
        return f.read()


def serve_program(source_fd: int, call_fd: int, reply_fd: int) -> None:
    """Import the program as ``solution`` and answer calls until the tests process is done."""
    source = _read_fd(source_fd).decode()
    calls, replies = os.fdopen(call_fd, "rb"), os.fdopen(reply_fd, "wb")
    # No program code runs before the tests process says it is ready (non-dumpable where it
    # shares this uid): otherwise the program could trace it before it protects itself.
    if calls.readline() != READY:
        os._exit(3)
    module = types.ModuleType("solution")
    module.__file__ = "solution.py"
    sys.modules["solution"] = module
    exec(compile(source, "solution.py", "exec"), module.__dict__)
    names = [n for n, v in vars(module).items() if not n.startswith("__") and callable(v)]
    _send(replies, {"names": names})
    for line in calls:
        request = json.loads(line)
        try:
            function = vars(module)[request["call"]]
            value = function(*decode(request["args"]), **decode(request["kwargs"]))
            reply = {"value": encode(value)}
        except Exception as exc:  # noqa: BLE001 - the exception is the tests' business
            reply = {"raise": [type(exc).__name__, str(exc)[:2000]]}
        _send(replies, reply)


def _abort(message: str) -> None:
    """End the tests process at once (no exception a test could catch): a failed run."""
    sys.stderr.write(f"sandbox harness: {message}\n")
    sys.stderr.flush()
    os._exit(3)


def _receive(replies: object) -> dict:
    line = replies.readline()  # type: ignore[attr-defined]
    if not line:
        _abort("the program process ended before the tests finished")
    try:
        message = json.loads(line)
    except ValueError:
        _abort("the program process sent a malformed reply")
    if type(message) is not dict:
        _abort("the program process sent a malformed reply")
    return message


def _exception(name: object, text: object) -> Exception:
    """The candidate's exception as the built-in class of that name, else RuntimeError; import
    errors too, so that an ImportError in this process always is the tests' own import."""
    cls = getattr(builtins, name, None) if type(name) is str else None
    if isinstance(cls, type) and issubclass(cls, Exception) and not issubclass(cls, ImportError):
        return cls(str(text))
    return RuntimeError(f"{name}: {text}")


def run_checks(payload_fd: int, reply_fd: int, call_fd: int, result_fd: int, shared: bool) -> None:
    """Run the hidden tests against the program process; the sentinel proves they finished.

    Where the program shares this process's uid (``shared``: a caller that is not root has
    one mapped uid) it first makes itself non-dumpable, which still forbids the program to
    trace it or read its memory.
    """
    if shared:
        import ctypes

        ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    calls, replies = os.fdopen(call_fd, "wb"), os.fdopen(reply_fd, "rb")
    calls.write(READY)
    calls.flush()
    payload = json.loads(_read_fd(payload_fd))
    sentinel = payload.pop("sentinel").encode()

    def proxy(name: str) -> types.FunctionType:
        def call(*args: object, **kwargs: object) -> object:
            _send(calls, {"call": name, "args": encode(list(args)), "kwargs": encode(kwargs)})
            reply = _receive(replies)
            if "raise" in reply and type(reply["raise"]) is list and len(reply["raise"]) == 2:
                raise _exception(*reply["raise"])
            try:
                return decode(reply["value"])
            except (KeyError, IndexError, ValueError, TypeError, RecursionError):
                _abort("the program process sent a malformed reply")

        call.__name__ = call.__qualname__ = name
        return call

    names = _receive(replies).get("names")
    if type(names) is not list:
        _abort("the program process sent a malformed greeting")
    namespace: dict[str, object] = {"__name__": "__main__", "__builtins__": builtins}
    for name in names:
        if type(name) is str and name.isidentifier() and not hasattr(builtins, name):
            namespace[name] = proxy(name)
    entry_point = payload["entry_point"]
    if entry_point is not None:
        namespace[entry_point] = proxy(entry_point)
    try:
        exec(compile(payload["tests"], "tests.py", "exec"), namespace)
        if payload["check"]:
            namespace["check"](proxy(entry_point))  # type: ignore[operator]
    except ImportError as exc:
        os.write(result_fd, b"missing module: " + str(exc.name).encode())
        raise
    os.write(result_fd, sentinel)
    os.close(result_fd)


if __name__ == "__main__":
    sys.set_int_max_str_digits(0)
    role, site_dir, shared = sys.argv[1:4]
    fds = [int(a) for a in sys.argv[4:]]
    if site_dir:
        sys.path.append(site_dir)  # the packages the sandbox shows (run with -S: no site)
    if role == "program":
        serve_program(*fds)
    else:
        run_checks(*fds, shared=shared == "1")
