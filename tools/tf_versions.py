#!/usr/bin/env python3
"""The test suite on other TensorFlow versions, a virtual environment each.

  python3 tools/tf_versions.py --versions=2.16.2,2.17.1,nightly
  python3 tools/tf_versions.py --versions=2.17.1 --tests=tests/test_train.py

For each version it makes a virtual environment under --venv_root (once;
a later call reuses it) with that TensorFlow (`nightly`: tf-nightly, the
newest on the package index, upgraded at every call) and the numpy pip
picks for it, installs requirements-keep-tensorflow.txt into it as in a
container that has its TensorFlow, runs pytest there (the README's
command, or on --tests) and prints one line a version:

  2.17.1 (numpy 1.26.4): 2 failed, 380 passed in 0:12:03; failed: ...

Each version's install and test output: VENV_ROOT/VERSION.log. CI stays
on requirements.txt's pins; docs/tests.md holds the table of versions.
"""

import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VERSION = re.compile(r'^(nightly|2\.\d+\.\d+(?:rc\d+|\.post\d+)?)$')
# pytest -q's last line, e.g. `2 failed, 380 passed in 718.30s (0:11:58)`.
SUMMARY = re.compile(r'^=*\s*((?:\d+ \w+(?:, )?)+) in ([\d.]+)s\b')
PROBLEM = re.compile(r'^(FAILED|ERROR) (\S+)')


def parse_args(argv):
  """The command line; exits with status 2 and one line where it is wrong."""
  parser = argparse.ArgumentParser(
      description=__doc__.split('\n')[0],
      formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
  parser.add_argument('--versions', required=True,
                      help='TensorFlow versions separated by commas, as pip '
                      'names them (2.17.1), or nightly')
  parser.add_argument('--tests', default='tests',
                      help='what pytest runs (default: %(default)s)')
  parser.add_argument('--pytest_args', default='-q -n 2 --dist worksteal',
                      help='(default: the README\'s, %(default)s)')
  parser.add_argument('--venv_root', default=os.path.expanduser(
      '~/.cache/cifar10_tf_versions'), help='where the environments and '
      'logs go (default: %(default)s)')
  parser.add_argument('--system_site_packages', action='store_true',
                      help="environments see this Python's packages: a "
                      'version installed here is not downloaded again')
  args = parser.parse_args(argv)
  args.versions = args.versions.split(',')
  wrong = [v for v in args.versions if not VERSION.match(v)]
  if wrong:
    parser.exit(2, 'Error: --versions takes TensorFlow versions such as '
                '2.17.1, or nightly (got %s)\n' % ', '.join(map(repr, wrong)))
  return args


def log_command(command, log):
  """Writes the `+ command` line a run's output follows in the log."""
  log.write('+ %s\n' % ' '.join(command))
  log.flush()


def run_logged(command, log, **kwargs):
  """Runs command with its output appended to the open file log; returns
  its exit status."""
  log_command(command, log)
  return subprocess.call(command, stdout=log, stderr=subprocess.STDOUT,
                         **kwargs)


def install(*, version, venv, log, system_site_packages):
  """Makes the environment (where missing) with that TensorFlow and the
  suite's other packages; returns a one-line error, or None."""
  python = os.path.join(venv, 'bin', 'python')
  if not os.path.exists(python):
    command = [sys.executable, '-m', 'venv', venv]
    if system_site_packages:
      command.insert(3, '--system-site-packages')
    if run_logged(command, log):
      return 'could not make a virtual environment at %s' % venv
  package = ['--upgrade', 'tf-nightly'] if version == 'nightly' else [
      'tensorflow==' + version]
  pip = [python, '-m', 'pip', 'install', '--disable-pip-version-check']
  if run_logged(pip + package, log):
    return 'pip could not install %s' % package[-1]
  if run_logged(pip + ['-r', os.path.join(
      ROOT, 'requirements-keep-tensorflow.txt')], log):
    return 'pip could not install requirements-keep-tensorflow.txt beside it'
  return None


def installed(venv):
  """(TensorFlow's version, numpy's) as the environment imports them."""
  out = subprocess.run(
      [os.path.join(venv, 'bin', 'python'), '-c',
       'import numpy, tensorflow; print(tensorflow.__version__, '
       'numpy.__version__)'], capture_output=True, text=True,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'), check=False)
  words = out.stdout.split()
  return tuple(words) if out.returncode == 0 and len(words) == 2 else (
      'unimportable', '?')


def run_tests(*, venv, tests, pytest_args, log):
  """Runs pytest in the environment; returns (summary, problems, time),
  problems the FAILED and ERROR test ids."""
  env = dict(os.environ, VIRTUAL_ENV=venv, PATH=os.path.join(
      venv, 'bin') + os.pathsep + os.environ.get('PATH', ''))
  env.pop('PYTHONHOME', None)
  command = [os.path.join(venv, 'bin', 'python'), '-m', 'pytest', '-rfE'] + (
      pytest_args.split() + tests.split())
  log_command(command, log)  # Streamed below: Popen, not run_logged.
  proc = subprocess.Popen(command, cwd=ROOT, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
  summary, took, problems = 'no summary (see the log)', '?', []
  for line in proc.stdout:
    log.write(line)
    match = SUMMARY.match(line.strip())
    if match:
      seconds = round(float(match.group(2)))
      summary, took = match.group(1), '%d:%02d:%02d' % (
          seconds // 3600, seconds // 60 % 60, seconds % 60)
    problem = PROBLEM.match(line)
    if problem:
      problems.append(problem.group(2))
  proc.wait()
  return summary, problems, took


def one_version(args, version):
  """Installs and tests one version; returns (its line, whether all
  passed)."""
  venv = os.path.join(args.venv_root, version)
  with open(venv + '.log', 'a') as log:
    error = install(version=version, venv=venv, log=log,
                    system_site_packages=args.system_site_packages)
    if error:
      return '%s: %s (%s.log)' % (version, error, venv), False
    tf_version, numpy_version = installed(venv)
    summary, problems, took = run_tests(
        venv=venv, tests=args.tests, pytest_args=args.pytest_args, log=log)
  name = tf_version if version != 'nightly' else 'nightly ' + tf_version
  line = '%s (numpy %s): %s in %s' % (name, numpy_version, summary, took)
  if problems:
    line += '; failed: ' + ', '.join(problems)
  passed = not problems and 'passed' in summary and 'failed' not in summary
  return line, passed


def main(argv):
  args = parse_args(argv)
  os.makedirs(args.venv_root, exist_ok=True)
  ok = True
  for version in args.versions:
    print('%s: installing and testing (log: %s.log)' % (
        version, os.path.join(args.venv_root, version)), flush=True)
    line, passed = one_version(args, version)
    print(line, flush=True)
    ok = ok and passed
  return 0 if ok else 1


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
