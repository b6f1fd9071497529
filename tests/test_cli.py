# SPDX-License-Identifier: Apache-2.0
"""``python -m asyncmr``: every subcommand's help, usage and exit statuses, and the demo's
options, checked before it runs."""

import os
import re
import sys
from pathlib import Path

import pytest

import asyncmr

ROOT = Path(__file__).resolve().parent.parent


def test_version_is_printed():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "asyncmr", "--version"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"asyncmr {asyncmr.__version__} (CUDA runtime "), proc.stdout


def test_demo_refuses_an_unknown_option():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "asyncmr", "demo", "--elemnts", "5"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc
    assert "unrecognized arguments: --elemnts 5" in proc.stderr
    assert proc.stderr.startswith("usage: python -m asyncmr demo "), proc.stderr


def _command_parsers():
    """Every subcommand's own argparse parser, by name (bench's from the checkout)."""
    from asyncmr import _cli, _info, cudf_pandas
    from asyncmr.__main__ import COMMANDS, demo_parser

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from asyncmr_bench.__main__ import parser as bench_parser
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    parsers = {"demo": demo_parser(), "info": _info.parser(), "plot": _cli.plot_parser(),
               "cudf-pandas": cudf_pandas.parser(), "bench": bench_parser()}
    assert sorted(parsers) == sorted(COMMANDS)
    return parsers


# In-house words a user does not share: none of them in a command's help or messages.
IN_HOUSE = re.compile(r"(?i)\b(doors?|stand-in|parks?|epoch|refused_unmarked|gpu host|"
                      r"stacks stage)\b")


def test_every_subcommand_describes_itself_and_every_option():
    for name, parser in _command_parsers().items():
        assert parser.prog == f"python -m asyncmr {name}", parser.prog
        assert parser.description and len(parser.description) > 40, name
        assert "exit status" in (parser.epilog or ""), name
        for action in parser._actions:
            assert action.help, f"{name}: {action.option_strings or action.dest} has no help"
        text = parser.format_help()
        assert not IN_HOUSE.search(text), (name, IN_HOUSE.search(text))


@pytest.mark.parametrize("command", ["demo", "info", "plot", "cudf-pandas", "bench"])
def test_help_of_each_subcommand_is_its_own(command):
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "asyncmr", command, "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: python -m asyncmr {command} "), proc.stdout
    assert "exit status" in proc.stdout, proc.stdout


@pytest.mark.parametrize("command", ["demo", "info", "plot", "cudf-pandas", "bench"])
def test_an_unknown_option_prints_that_subcommands_usage(command, tmp_path):
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "asyncmr", command, "--bogus", "x"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc
    assert f"usage: python -m asyncmr {command} " in proc.stderr, proc.stderr
    assert "usage: python -m asyncmr [-h]" not in proc.stderr, proc.stderr
    assert "--bogus" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_the_top_level_help_lists_the_commands_and_the_exit_statuses():
    from asyncmr import _cli
    from asyncmr.__main__ import COMMANDS, parser

    text = parser().format_help()
    for name in COMMANDS:
        assert f"    {name}" in text, name
    for code, _ in _cli.EXIT_STATUSES:
        assert f"  {code}  " in text, code
    codes = [code for code, _ in _cli.EXIT_STATUSES]
    assert len(set(codes)) == len(codes) == 5


@pytest.mark.parametrize("command", [["info"], ["info", "--json"], ["demo"], ["bench", "--quick"],
                                     ["cudf-pandas", "SCRIPT"]])
def test_without_a_usable_gpu_every_command_exits_3_in_one_line(command, tmp_path):
    # Every device hidden from the child (CUDA_VISIBLE_DEVICES=""), so this runs on GPU hosts
    # too; the same status for every command, and the program named once.
    from asyncmr._cli import EXIT_NO_GPU
    from gpu_helpers import describe, require_hidden_devices, run_python

    require_hidden_devices()
    script = tmp_path / "script.py"
    script.write_text("print('the script ran')\n")
    args = [str(script) if a == "SCRIPT" else a for a in command]
    if command[0] == "bench":
        args += ["--out", str(tmp_path / "out")]
    proc = run_python(f"import os, sys; os.chdir({str(ROOT)!r}); from asyncmr.__main__ import "
                      "main; sys.exit(main(sys.argv[1:]))", *args,
                      env={"CUDA_VISIBLE_DEVICES": ""}, timeout=120)
    assert proc.returncode == EXIT_NO_GPU, describe(proc)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, describe(proc)
    assert lines[0].startswith(f"asyncmr {command[0]}: no usable CUDA "), describe(proc)
    assert lines[0].count("asyncmr:") == 0 and "Traceback" not in proc.stderr, describe(proc)
    assert "the script ran" not in proc.stdout


def test_a_missing_package_has_an_exit_status_of_its_own(tmp_path):
    # The benchmark outside a checkout: not installed with the package.
    import subprocess

    from asyncmr._cli import EXIT_MISSING

    env = {k: v for k, v in os.environ.items() if k != "ASYNCMR_BENCHMARKS"}
    proc = subprocess.run([sys.executable, "-m", "asyncmr", "bench"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == EXIT_MISSING, proc
    assert proc.stderr.startswith("asyncmr bench: the benchmark is not part of the installed")


@pytest.mark.parametrize("value", ["-5", "0", "-0", "1.5", "x", "", "\u0663", " 7"])
def test_demo_refuses_elements_that_are_not_a_positive_integer(value, capsys):
    from asyncmr.__main__ import main

    with pytest.raises(SystemExit) as exit:  # before the demo looks for a GPU
        main(["demo", "--elements", value])
    assert exit.value.code == 2
    assert (f"error: argument --elements: must be a positive integer, got {value!r}"
            in capsys.readouterr().err)


@pytest.mark.parametrize("value", [str((1 << 30) + 1), str(10**30), "9" * 5000])
def test_demo_refuses_more_elements_than_it_can_hold_before_running(value, capsys):
    # The demo makes a float64 array of --elements on the host and several on the GPU: a count
    # past 2**30 (8 GiB an array) would end in a NumPy or CuPy traceback on a GPU host. Refused
    # up front, naming the bound.
    from asyncmr.__main__ import main

    with pytest.raises(SystemExit) as exit:  # before the demo looks for a GPU
        main(["demo", "--elements", value])
    assert exit.value.code == 2
    assert "error: argument --elements: must be at most 1073741824" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["", "a-file"])
def test_demo_refuses_a_history_dir_it_cannot_write_before_running(where, tmp_path, capsys):
    # Checked before the demo looks for a GPU: found after the run it was a traceback
    # (FileExistsError), and an empty name wrote into the working directory.
    from asyncmr.__main__ import main

    if where:
        (tmp_path / where).write_text("not a directory")
        where = str(tmp_path / where)
    with pytest.raises(SystemExit) as exit:
        main(["demo", "--history", where])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert "error: argument --history: " in err
    assert ("needs a directory name" if not where else "is not a directory") in err


@pytest.mark.parametrize("twice, named, values", [
    (["--elements", "8", "--elements", "9"], "--elements", (8, 9)),
    (["--history", "a", "--history=b"], "--history", ("a", "b")),
])
def test_demo_refuses_an_option_given_twice_naming_it(twice, named, values, capsys):
    from asyncmr.__main__ import main

    with pytest.raises(SystemExit) as exit:
        main(["demo", *twice])
    assert exit.value.code == 2
    first, then = values
    assert (f"error: argument {named}: given twice (first {first!r}, then {then!r})"
            in capsys.readouterr().err)


def test_the_demo_writes_its_history_as_json_and_its_timeline(tmp_path, capsys):
    # The files `demo --history DIR` writes after its GPU run, from the committed recording.
    pytest.importorskip("matplotlib", reason="the timeline needs matplotlib")
    from asyncmr.__main__ import _write_history
    from asyncmr.history import load

    recorded = load(Path(__file__).resolve().parent.parent / "docs" / "images" /
                    "demo-history.json")
    _write_history(recorded, tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["demo-history.json",
                                                                    "demo-timeline.png"]
    assert load(tmp_path / "out" / "demo-history.json").events == recorded.events
    assert (tmp_path / "out" / "demo-timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "export_torch_snapshot" in capsys.readouterr().out
