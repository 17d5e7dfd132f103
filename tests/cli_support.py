"""Shared helper of the command-line tests: a command that must fail in one line."""

from __future__ import annotations

from evosteer_flyte.cli import main


def cli_fails(argv: list[str], capsys) -> tuple[int, str]:
    """Run the command; its exit status and its one stderr line (asserted to be one line,
    without a traceback)."""
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own exit
        code = exc.code
    _, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return code, lines[0]
