"""Shared fixtures: tiny datasets on disk, free ports, processes killed by PID."""

import os
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, 'scripts'))

import free_ports as scripts_free_ports  # pylint: disable=g-import-not-at-top,wrong-import-position
import make_synthetic_cifar10  # pylint: disable=g-import-not-at-top,wrong-import-position

TRAINER = os.path.join(ROOT, 'train_distributed.py')


@pytest.fixture(scope='session')
def tiny_data(tmp_path_factory):
  """A synthetic CIFAR-10 directory: 5 x 40 training and 50 test records."""
  data_dir = str(tmp_path_factory.mktemp('cifar10') / 'cifar-10-batches-bin')
  make_synthetic_cifar10.main(['--data_dir', data_dir, '--train_records',
                               '40', '--test_records', '50', '--seed', '1'])
  return data_dir


def free_ports(n):
  """Returns n distinct TCP ports, free now, that no other connection takes
  before the tasks bind them (see scripts/free_ports.py)."""
  return scripts_free_ports.free_ports(n)


class Processes:
  """Starts processes with logs in a folder; kills exactly those, by PID."""

  def __init__(self, log_dir):
    self.log_dir = log_dir
    self.procs = {}

  def start(self, name, args, env=None, prefix=()):
    """Starts `prefix... python args...` with output to LOG_DIR/name.log.

    A prefix must exec Python in its own process (as `ip netns exec` does),
    so that the PID is Python's.
    """
    log = open(os.path.join(self.log_dir, name + '.log'), 'w')
    full_env = dict(os.environ, PYTHONUNBUFFERED='1')
    full_env.pop('TF_CONFIG', None)  # A cluster comes only from the test.
    full_env.update(env or {})
    proc = subprocess.Popen(list(prefix) + [sys.executable] + list(args),
                            stdout=log,
                            stderr=subprocess.STDOUT, env=full_env, cwd=ROOT)
    log.close()
    self.procs[name] = proc
    return proc

  def trainer(self, name, *flags, env=None, prefix=()):
    """Starts train_distributed.py with the given flags."""
    return self.start(name, [TRAINER] + list(flags), env=env, prefix=prefix)

  def log(self, name):
    with open(os.path.join(self.log_dir, name + '.log')) as f:
      return f.read()

  def wait_all(self, timeout):
    """Waits for every process; returns {name: exit code}.

    Fails the test, with each log's tail, if one is still running after
    `timeout` seconds (counted from this call).
    """
    deadline = time.time() + timeout
    codes = {}
    for name, proc in self.procs.items():
      try:
        codes[name] = proc.wait(max(0.1, deadline - time.time()))
      except subprocess.TimeoutExpired:
        pytest.fail('%s still running after %d s; logs:\n%s' %
                    (name, timeout, self.tails()))
    return codes

  def wait_for_line(self, name, text, timeout):
    """Waits until `text` appears in the log of `name`."""
    deadline = time.time() + timeout
    while time.time() < deadline:
      if text in self.log(name):
        return
      if self.procs[name].poll() is not None:
        break
      time.sleep(0.2)
    pytest.fail('%r never appeared in %s; logs:\n%s' % (text, name,
                                                         self.tails()))

  def tails(self, lines=15):
    return '\n'.join('--- %s\n%s' % (n, '\n'.join(
        self.log(n).splitlines()[-lines:])) for n in self.procs)

  def kill_all(self):
    for proc in self.procs.values():
      if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture
def procs(tmp_path):
  p = Processes(str(tmp_path))
  yield p
  p.kill_all()


@pytest.fixture
def flags():
  """train_distributed's flags at their defaults, as in a fresh process."""
  import train_distributed  # pylint: disable=g-import-not-at-top
  values = train_distributed.FLAGS
  for name in values:
    values[name].unparse()
  yield values
  for name in values:
    values[name].unparse()
