"""The fork server's client: starts the trainer's tasks from the one fork
server of the test session (its server side is forkserver.py) and stands
for each as a process (ForkedProcess).
"""

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

from suite_env import ROOT, TRAINER, suite_env

# TESTS_FORKSERVER=0: every task starts Python afresh (see forkserver.py).
USE_FORKSERVER = os.environ.get('TESTS_FORKSERVER', '1') != '0'
# What a forked task may be given in its environment beyond the suite's: the
# variables TensorFlow reads as it loads (TF_CPP_MIN_LOG_LEVEL and the like)
# it read once, in the server, so a task that needs them starts afresh.
FORKED_ENV = {'TF_CONFIG'}



# The fork server's, taken before any test could change os.environ: what
# its TensorFlow read as it loaded.
SERVER_ENV = suite_env()
# And what TensorFlow itself puts in the environment as it loads
# (TF2_BEHAVIOR and others), as it does in every task.
_BEFORE_TENSORFLOW = dict(os.environ)
import tensorflow as tf  # pylint: disable=g-import-not-at-top,wrong-import-position
SET_BY_TENSORFLOW = {k for k in os.environ
                     if os.environ[k] != _BEFORE_TENSORFLOW.get(k)}


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
    if still_running(self) and self._pidfd is not None:
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


def still_running(proc):
  """Whether proc has not exited; a forked task whose fork server is gone
  (its status unknown) counts as running, to be killed."""
  try:
    return proc.poll() is None
  except RuntimeError:
    return True
