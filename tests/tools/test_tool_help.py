"""Every command-line argument of every tool has help text.

Each tool under ``tools/`` and ``tools/analysis/`` (found by globbing, so a new tool is
covered without listing it) and ``python -m mmdet3d_scaling.patches`` runs as a user runs
it, ``python tools/X.py --help``, in a subprocess. A ``sitecustomize`` module on that
process's path records the real parser at the moment argparse prints the help (through
``ArgumentParser.print_help``, what ``-h`` calls): every action, those of subcommands
included, with its help. The parsers the engine exposes (``train_parser`` /
``test_parser`` behind tools/train.py and tools/test.py) are checked in process too.
``help=argparse.SUPPRESS`` is an internal flag hidden on purpose (e.g. the worker flag
of benchmark_bev_pool.py) and counts as documented.
"""
import argparse
import json
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Union

import pytest

from mmdet3d_scaling.engine import cli

REPO = Path(__file__).resolve().parents[2]
TOOLS = sorted(p.relative_to(REPO).as_posix()
               for p in [*REPO.glob('tools/*.py'), *REPO.glob('tools/analysis/*.py')])
MODULES = ['mmdet3d_scaling.patches']

# Written into the subprocess's sitecustomize: observes the parser, changes nothing.
RECORDER = textwrap.dedent('''\
    import argparse
    import json
    import os

    _print_help = argparse.ArgumentParser.print_help


    def _actions(parser, prog):
        rows = []
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            name = '/'.join(action.option_strings) or action.dest
            rows.append(dict(parser=prog, argument=name, help=action.help))
            if isinstance(action, argparse._SubParsersAction):
                for choice in action._choices_actions:  # the subcommand lines
                    rows.append(dict(parser=prog, argument=f'subcommand {choice.dest}',
                                     help=choice.help))
                for sub_name, sub in action.choices.items():
                    rows.extend(_actions(sub, f'{prog} {sub_name}'))
        return rows


    def print_help(self, file=None):
        path = os.environ.get('TOOL_HELP_DUMP')
        if path and not os.path.exists(path):  # the top-level parser only
            with open(path, 'w') as out:
                json.dump(_actions(self, self.prog), out)
        return _print_help(self, file)


    argparse.ArgumentParser.print_help = print_help
''')


@pytest.fixture(scope='module')
def recorder_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp('help_recorder')
    (path / 'sitecustomize.py').write_text(RECORDER)
    return path


def _missing_help(rows: List[Dict]) -> List[str]:
    return [f"{row['parser']}: {row['argument']}" for row in rows
            if not (row['help'] or '').strip()]


def _run_help(command: List[str], recorder_dir: Path, dump: Path) -> Union[List[Dict], str]:
    """The recorded arguments of ``command --help``, or why there are none."""
    env = dict(os.environ, TOOL_HELP_DUMP=str(dump), PYTHONPATH=os.pathsep.join(
        [str(recorder_dir), str(REPO), os.environ.get('PYTHONPATH', '')]))
    proc = subprocess.run(command + ['--help'], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    shown = ' '.join(command)
    if proc.returncode != 0:
        return f'{shown} --help failed:\n{proc.stdout}\n{proc.stderr}'
    if 'usage:' not in proc.stdout:
        return f'{shown} --help printed no usage:\n{proc.stdout}'
    if not dump.is_file():
        return f'{shown} --help printed help without an argparse parser reaching print_help'
    return json.loads(dump.read_text())


@pytest.fixture(scope='module')
def recorded(recorder_dir, tmp_path_factory) -> Dict[str, Union[List[Dict], str]]:
    """``--help`` of every tool and module, a few processes at a time (each imports the
    stack, which takes seconds on a loaded machine)."""
    dumps = tmp_path_factory.mktemp('help_dumps')
    commands = {tool: [sys.executable, tool] for tool in TOOLS}
    commands.update({module: [sys.executable, '-m', module] for module in MODULES})
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {name: pool.submit(_run_help, command, recorder_dir,
                                     dumps / f'{index}.json')
                   for index, (name, command) in enumerate(commands.items())}
        return {name: future.result() for name, future in futures.items()}


def test_tools_are_found():
    assert 'tools/train.py' in TOOLS and 'tools/analysis/plot_scaling.py' in TOOLS
    assert 'tools/benchmark_view_transform.py' in TOOLS


@pytest.mark.slow
@pytest.mark.parametrize('name', TOOLS + MODULES)
def test_every_argument_has_help(name, recorded):
    rows = recorded[name]
    assert not isinstance(rows, str), rows
    assert rows, f'{name}: no arguments recorded'
    missing = _missing_help(rows)
    assert not missing, f'{name}: arguments without help text: {missing}'


@pytest.mark.parametrize('build', [cli.train_parser, cli.test_parser],
                         ids=lambda build: build.__name__)
def test_exposed_engine_parsers(build):
    parser: argparse.ArgumentParser = build()
    missing = [action.option_strings or action.dest for action in parser._actions
               if not isinstance(action, argparse._HelpAction)
               and not (action.help or '').strip()]
    assert not missing, f'{build.__name__} (mmdet3d_scaling/engine/cli.py): {missing}'


@pytest.mark.slow
def test_recorder_reports_an_argument_without_help(recorder_dir, tmp_path):
    """The check can fail: a parser with a bare argument is reported by name."""
    script = tmp_path / 'bare_tool.py'
    script.write_text('import argparse\n'
                      'p = argparse.ArgumentParser()\n'
                      "p.add_argument('--documented', help='has help')\n"
                      "p.add_argument('--bare')\n"
                      'p.parse_args()\n')
    rows = _run_help([sys.executable, str(script)], recorder_dir, tmp_path / 'a.json')
    assert not isinstance(rows, str), rows
    assert _missing_help(rows) == ['bare_tool.py: --bare']
