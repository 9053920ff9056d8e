"""Other TensorFlow versions: the line an untested one gets, and the tool
that runs the suite on a version in a virtual environment of its own.

The tool is run for real: a virtual environment that sees this Python's
packages (so the pinned TensorFlow is not downloaded again), pip, and
pytest on two tests written here, one passing and one failing.
"""

import importlib.metadata
import os
import subprocess
import sys

import pytest
import tensorflow as tf

from helpers import ROOT, TRAINER, run_in_group, single_process_flags, suite_env
from training.runtime import versions

TOOL = os.path.join(ROOT, 'tools', 'tf_versions.py')


@pytest.mark.parametrize('version, tested', [
    ('2.16.2', True), ('2.17.1', True), ('2.21.0', True), ('2.22.0rc0', True),
    ('2.23.0-dev20261026', True), ('2.15.1', False), ('2.24.0', False),
    ('2.9.3', False), ('1.15.5', False), ('3.0.0', False), ('unknown', False),
])
def test_a_version_outside_the_range_gets_one_line(version, tested):
  # The range by hand: 2.16 to 2.23 (docs/tests.md's table).
  line = versions.untested_line(version)
  if tested:
    assert line is None
  else:
    assert line == (
        'Warning: TensorFlow %s is outside the versions this suite is tested '
        'on (2.16 to 2.23: docs/tests.md#tensorflow-versions); it may work.'
        % version)


def test_the_trainer_names_an_untested_tensorflow_and_trains(tiny_data,
                                                             tmp_path):
  # The installed TensorFlow made to say 2.15.1, then the trainer run as
  # __main__: its warning, and a one-process run of 2 steps to the end.
  train_dir = str(tmp_path / 'train')
  flags = single_process_flags(tiny_data, train_dir) + ['--max_steps=2']
  code = ('import sys, runpy, tensorflow\n'
          'tensorflow.__version__ = "2.15.1"\n'
          'sys.argv = [%r] + %r\n'
          'runpy.run_path(%r, run_name="__main__")\n' % (
              TRAINER, flags, TRAINER))
  status, out = run_in_group([sys.executable, '-c', code], timeout=600,
                             cwd=ROOT, env=suite_env())
  assert status == 0, out
  assert out.count('Warning: TensorFlow 2.15.1 is outside') == 1, out
  assert 'training finished at global step 2' in out, out


def test_the_trainer_says_nothing_of_a_tested_version(tiny_data, tmp_path):
  # The TensorFlow installed: within 2.16-2.23 (by hand), no line; outside
  # (the suite run on another by tools/tf_versions.py), the line.
  tested = (2, 16) <= tuple(
      int(x) for x in tf.__version__.split('.')[:2]) <= (2, 23)
  flags = single_process_flags(tiny_data, str(tmp_path / 'train'))
  status, out = run_in_group(
      [sys.executable, TRAINER, '--max_steps=1'] + flags, timeout=600,
      cwd=ROOT, env=suite_env())
  assert status == 0, out
  assert ('Warning: TensorFlow' in out) == (not tested), out



@pytest.mark.slow
def test_the_tool_runs_the_tests_in_an_environment_and_names_failures(
    tmp_path):
  tests = tmp_path / 'test_two.py'
  tests.write_text('def test_passes():\n  assert 1 + 1 == 2\n\n'
                   'def test_fails():\n  assert 1 + 1 == 3\n')
  try:
    version = importlib.metadata.version('tensorflow')
  except importlib.metadata.PackageNotFoundError:
    pytest.skip('not the tensorflow package (tf-nightly?): the tool would '
                'download it again')
  status, out = run_in_group(
      [sys.executable, TOOL, '--versions=' + version,
       '--venv_root=' + str(tmp_path / 'venvs'), '--system_site_packages',
       '--tests=' + str(tests), '--pytest_args=-q -p no:cacheprovider'],
      timeout=900, cwd=ROOT, env=suite_env())
  lines = out.splitlines()
  assert status == 1, out
  assert lines[0] == '%s: installing and testing (log: %s.log)' % (
      version, tmp_path / 'venvs' / version)
  numpy_version = importlib.metadata.version('numpy')
  prefix = '%s (numpy %s): 1 failed, 1 passed in ' % (version, numpy_version)
  assert lines[1].startswith(prefix), out
  # Its time as H:MM:SS, then the failed test as pytest names it.
  took = lines[1][len(prefix):].split(';')[0]
  assert took.count(':') == 2 and took.replace(':', '').isdigit(), out
  assert lines[1].endswith('; failed: %s::test_fails' % os.path.relpath(
      tests, ROOT)), out
  # The environment's own Python ran them, and its log holds the output.
  python = tmp_path / 'venvs' / version / 'bin' / 'python'
  log = (tmp_path / 'venvs' / (version + '.log')).read_text()
  assert '+ %s -m pytest' % python in log
  assert 'test_two.py' in log and 'assert 1 + 1 == 3' in log


@pytest.mark.parametrize('versions_flag', ['2.17', 'latest', '2.17.1,,nightly',
                                           'tensorflow==2.17.1'])
def test_the_tool_refuses_what_is_no_version(versions_flag, tmp_path):
  proc = subprocess.run(
      [sys.executable, TOOL, '--versions=' + versions_flag,
       '--venv_root=' + str(tmp_path)], capture_output=True, text=True,
      env=suite_env(), check=False)
  assert proc.returncode == 2
  assert proc.stderr.startswith('Error: --versions takes TensorFlow versions '
                                'such as 2.17.1, or nightly (got ')
  assert len(proc.stderr.splitlines()) == 1
  assert os.listdir(tmp_path) == []


def requirement_names(path):
  """The package names a requirements file names, and the files it reads."""
  names, reads = [], []
  with open(path) as f:
    for line in f:
      line = line.split('#')[0].strip()
      if line.startswith('-r '):
        reads.append(line[3:].strip())
      elif line:
        names.append(line.split('==')[0].split('[')[0].lower())
  return names, reads


def test_a_containers_tensorflow_is_kept_by_the_second_file():
  # What a TensorFlow decides for itself (its numpy and ml_dtypes) is named
  # only in requirements.txt, which reads the rest from
  # requirements-keep-tensorflow.txt; TensorBoard is in both, pinned only in
  # the first (an installed one satisfies the second). Together they are
  # the whole install.
  full, reads = requirement_names(os.path.join(ROOT, 'requirements.txt'))
  keep, keep_reads = requirement_names(
      os.path.join(ROOT, 'requirements-keep-tensorflow.txt'))
  assert sorted(full) == ['ml_dtypes', 'numpy', 'tensorboard', 'tensorflow']
  assert reads == ['requirements-keep-tensorflow.txt'] and keep_reads == []
  assert not set(keep) & {'tensorflow', 'tf-nightly', 'tensorflow-cpu',
                          'numpy', 'ml_dtypes', 'ml-dtypes', 'keras'}
  assert 'tf-slim' in keep and 'pytest' in keep
  with open(os.path.join(ROOT, 'requirements.txt')) as f:
    assert any(l.startswith('tensorboard==') for l in f.read().splitlines())
  with open(os.path.join(ROOT, 'requirements-keep-tensorflow.txt')) as f:
    assert 'tensorboard\n' in f.read().splitlines(keepends=True)
