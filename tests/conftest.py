"""Shared fixtures: tiny datasets on disk, free ports, processes killed by PID."""

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, 'scripts'))

import free_ports as scripts_free_ports  # pylint: disable=g-import-not-at-top,wrong-import-position
import make_synthetic_cifar10  # pylint: disable=g-import-not-at-top,wrong-import-position

TRAINER = os.path.join(ROOT, 'train_distributed.py')
# TESTS_FORKSERVER=0: every task starts Python afresh (see forkserver.py).
USE_FORKSERVER = os.environ.get('TESTS_FORKSERVER', '1') != '0'
# What a forked task may be given in its environment beyond the suite's: the
# variables TensorFlow reads as it loads (TF_CPP_MIN_LOG_LEVEL and the like)
# it read once, in the server, so a task that needs them starts afresh.
FORKED_ENV = {'TF_CONFIG'}


@pytest.fixture(scope='session')
def tiny_data(tmp_path_factory):
  """A synthetic CIFAR-10 directory: 5 x 40 training and 50 test records."""
  data_dir = str(tmp_path_factory.mktemp('cifar10') / 'cifar-10-batches-bin')
  make_synthetic_cifar10.main(['--data_dir', data_dir, '--train_records',
                               '40', '--test_records', '50', '--seed', '1'])
  return data_dir


# Every task of a cluster spec (JSON in argv[1]) as a gRPC server, all in
# one process of their own, for tests that build a worker's graph in the
# test itself: start it with procs.start (it is killed by PID at the end:
# TensorFlow cannot stop a server it started) and wait for "serving".
SERVERS = """
import json, sys
import tensorflow as tf
spec = tf.train.ClusterSpec(json.loads(sys.argv[1]))
servers = [tf.distribute.Server(spec, job, task) for job in spec.jobs
           for task in spec.task_indices(job)]
print('serving', flush=True)
servers[0].join()
"""


def free_ports(n):
  """Returns n distinct TCP ports, free now, that no other connection takes
  before the tasks bind them (see scripts/free_ports.py)."""
  return scripts_free_ports.free_ports(n)


class ForkedProcess:
  """A task the fork server started: the part of subprocess.Popen's
  interface the tests use. The server, its parent, writes its exit status;
  signals go through a pidfd, which names this process and never another
  that got its PID once it was reaped."""

  def __init__(self, pid, status_path, server):
    self.pid = pid
    self.returncode = None
    self._status_path = status_path
    self._server = server
    try:
      self._pidfd = os.pidfd_open(pid)
    except ProcessLookupError:  # Gone and reaped already: its status says.
      self._pidfd = None

  def poll(self):
    if self.returncode is None and os.path.exists(self._status_path):
      with open(self._status_path) as f:
        self.returncode = int(f.read())
      if self._pidfd is not None:
        os.close(self._pidfd)
        self._pidfd = None
    if self.returncode is None and self._server.poll() is not None:
      raise RuntimeError('the fork server died: PID %d\'s status is lost; '
                         'see %s' % (self.pid, self._status_path))
    return self.returncode

  def wait(self, timeout=None):
    deadline = None if timeout is None else time.time() + timeout
    while self.poll() is None:
      if deadline is not None and time.time() > deadline:
        raise subprocess.TimeoutExpired('PID %d' % self.pid, timeout)
      time.sleep(0.02)
    return self.returncode

  def send_signal(self, signum):
    if self.poll() is None and self._pidfd is not None:
      try:
        signal.pidfd_send_signal(self._pidfd, signum)
      except ProcessLookupError:
        pass  # Ended: its status is on its way.

  def terminate(self):
    self.send_signal(signal.SIGTERM)

  def kill(self):
    self.send_signal(signal.SIGKILL)


class ForkServer:
  """The one fork server of this test session, started at its first use."""

  def __init__(self):
    self.proc = None
    self.dir = None

  def start(self):
    self.dir = tempfile.mkdtemp(prefix='forkserver-')
    with open(os.path.join(self.dir, 'server.log'), 'w') as log:
      self.proc = subprocess.Popen(
          [sys.executable, os.path.join(ROOT, 'tests', 'forkserver.py'),
           self.dir], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
          stderr=log, env=SERVER_ENV, cwd=ROOT)
    ready = select.select([self.proc.stdout], [], [], 180)[0]
    if not ready or self.proc.stdout.readline() != b'ready\n':
      self.proc.kill()
      with open(os.path.join(self.dir, 'server.log')) as log:
        raise RuntimeError('the fork server did not start (or run with '
                           'TESTS_FORKSERVER=0):\n' + log.read())

  def fork(self, argv, env, log_path, netns=None, fault=None):
    """Starts `python argv` in ROOT, its environment env, its output (stdout
    and stderr) appended to log_path, in the network namespace netns (a
    name) if given, after running the Python source fault if given; returns
    its ForkedProcess."""
    if self.proc is None:
      self.start()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
      conn.settimeout(60)
      conn.connect(os.path.join(self.dir, 'socket'))
      with conn.makefile('rw') as stream:
        stream.write(json.dumps({'argv': argv, 'env': env, 'cwd': ROOT,
                                 'log': log_path, 'netns': netns,
                                 'fault': fault}) + '\n')
        stream.flush()
        pid, number = (int(n) for n in stream.readline().split())
    return ForkedProcess(pid, os.path.join(self.dir, '%d.status' % number),
                         self.proc)

  def stop(self):
    if self.proc is not None:
      self.proc.kill()
      self.proc.wait()
      shutil.rmtree(self.dir, ignore_errors=True)
      self.proc = None


FORK_SERVER = ForkServer()


@pytest.fixture(scope='session', autouse=True)
def _stop_fork_server():
  yield
  FORK_SERVER.stop()


@pytest.fixture(autouse=True)
def _restore_environ():
  """Gives every test the environment the suite started with. A test that
  imports a script setting a variable (scripts/show_inputs.py sets
  TF_CPP_MIN_LOG_LEVEL) changed it for every later test, whose trainers
  then differed from the fork server's and each started Python afresh: the
  suite took 17 minutes instead of 11."""
  before = dict(os.environ)
  yield
  os.environ.clear()
  os.environ.update(before)


def suite_env(env=None):
  """The environment of a task: the suite's, unbuffered, no TF_CONFIG."""
  full_env = dict(os.environ, PYTHONUNBUFFERED='1')
  full_env.pop('TF_CONFIG', None)  # A cluster comes only from the test.
  full_env.update(env or {})
  return full_env


# The fork server's, taken before any test could change os.environ: what
# its TensorFlow read as it loaded.
SERVER_ENV = suite_env()
# And what TensorFlow itself puts in the environment as it loads
# (TF2_BEHAVIOR and others), as it does in every task.
_BEFORE_TENSORFLOW = dict(os.environ)
import tensorflow  # pylint: disable=g-import-not-at-top,wrong-import-position,unused-import
SET_BY_TENSORFLOW = {k for k in os.environ
                     if os.environ[k] != _BEFORE_TENSORFLOW.get(k)}


def forkable(args, full_env, prefix):
  """Whether the fork server may start `prefix... python args...`: the
  trainer, in the server's environment (but for FORKED_ENV), directly or
  under `ip netns exec NAME` (which the server does itself)."""

  def loaded(env):  # (pytest names the running test in the environment.)
    return {k: v for k, v in env.items()
            if k not in FORKED_ENV | SET_BY_TENSORFLOW and
            not k.startswith('PYTEST_')}

  return (USE_FORKSERVER and args and args[0] == TRAINER and
          loaded(full_env) == loaded(SERVER_ENV) and
          (not prefix or (len(prefix) == 4 and
                          list(prefix[:3]) == ['ip', 'netns', 'exec'])))


class Processes:
  """Starts processes with logs in a folder; kills exactly those, by PID."""

  def __init__(self, log_dir):
    self.log_dir = log_dir
    self.procs = {}

  def start(self, name, args, env=None, prefix=(), fault=None):
    """Starts `prefix... python args...` with output to LOG_DIR/name.log.

    A prefix must exec Python in its own process (as `ip netns exec` does),
    so that the PID is Python's. A fault (Python source run in the task
    before the trainer, see tests/forkserver.py) needs the fork server:
    without it the test is skipped.
    """
    log_path = os.path.join(self.log_dir, name + '.log')
    full_env = suite_env(env)
    if forkable(args, full_env, prefix):
      open(log_path, 'w').close()
      proc = FORK_SERVER.fork(list(args), full_env, log_path,
                              netns=prefix[3] if prefix else None,
                              fault=fault)
    elif fault:
      pytest.skip('a fault is injected through the fork server, which '
                  'cannot start this task (TESTS_FORKSERVER=0?)')
    else:
      with open(log_path, 'w') as log:
        proc = subprocess.Popen(list(prefix) + [sys.executable] + list(args),
                                stdout=log, stderr=subprocess.STDOUT,
                                env=full_env, cwd=ROOT)
    self.procs[name] = proc
    return proc

  def trainer(self, name, *flags, env=None, prefix=(), fault=None):
    """Starts train_distributed.py with the given flags."""
    return self.start(name, [TRAINER] + list(flags), env=env, prefix=prefix,
                      fault=fault)

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
        proc.kill()  # By PID, or the fork server's by pidfd.
        proc.wait(60)


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
