"""Starts the tests' train_distributed.py tasks without importing TensorFlow
in each: a fork server, for the tests only.

A task spends 4-5 s of CPU importing TensorFlow before its first line of
ours runs (measured on CI's 2-core AMD EPYC), and the suite starts some 400
of them: on 2 cores that import was most of the suite's time. This server
imports, once, the modules train_distributed.py imports (read from its
source, in its order), as its prologue does it (TF_USE_LEGACY_KERAS=1,
TF_CPP_MIN_LOG_LEVEL's default), and then forks a child per request. Each
child is a real process of its own: its PID, its ports, its files, its
signals and its exit status. It runs
train_distributed.py as __main__ with the requested argv, environment,
working directory and log file, so its flags, its stderr filter, its
signal handlers and its exit are the script's own. Only the import is not
repeated; what happens before TensorFlow loads (log_filter's start, the
absl banner) is tested in processes started afresh (test_tf_log_filter.py,
the scripts' tests).

The server is the children's parent: it reaps them and writes each exit
status, as subprocess.Popen reports it (-N for signal N), to
STATUS_DIR/N.status, N the request's number (PIDs come back: 32768 of them
here, and TensorFlow's threads use them up too). forkserver_client.ForkedProcess
reads it, and signals the child through a pidfd, which never reaches
another process that got its PID.

Protocol, on the Unix socket STATUS_DIR/socket: one JSON line per request,
{"argv", "env", "cwd", "log", "netns", "fault"}; the answer is one line,
"PID N". "fault", if given, is Python source the child runs just before
the trainer: a test's fault at a moment no signal from outside can hit
(tests/test_long_run.py kills a ps between a worker's last step and its
final save or its done posts).
With "netns" (a name made by `ip netns add`) the child joins that network
namespace: what `ip netns exec NAME` does for the network; its other steps
(a mount namespace, /etc/netns/NAME's files over /etc) are not done, and
nothing here needs them.

The server ignores SIGINT (a Ctrl-C to pytest reaches its whole process
group), so that it outlives the tests' clean-up; its children get Python's
own handler back.
"""

import ast
import ctypes
import importlib
import itertools
import json
import os
import select
import signal
import socket
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAINER = os.path.join(ROOT, 'train_distributed.py')


def trainer_imports():
  """The modules train_distributed.py imports at its top level, in its
  order: `import a.b` and `from a import b` (b a module, or a name in a)
  give a.b, or a. Read from its source, so that a module it comes to
  import, or one renamed, is preloaded too."""
  with open(TRAINER) as f:
    tree = ast.parse(f.read(), TRAINER)
  for node in tree.body:
    if isinstance(node, ast.Import):
      yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and not node.level:
      for alias in node.names:
        yield '%s.%s' % (node.module, alias.name)


def preload():
  """Imports what a task imports before its main runs, as the trainer's
  prologue does, so that the children find it loaded."""
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '1')
  sys.path.insert(0, ROOT)
  from training.runtime import process  # pylint: disable=g-import-not-at-top
  process.tensorflow_defaults()
  for name in trainer_imports():
    try:
      importlib.import_module(name)
    except ModuleNotFoundError as e:
      if e.name != name:  # Not a module: a name its package defines.
        raise
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  # TensorFlow loads tf.compat.v1 and its submodules on first use.
  tf.compat.v1.train.MonitoredSession  # pylint: disable=pointless-statement
  sys.path.remove(ROOT)


def write_status(status_dir, number, status):
  """Writes the exit status of request number's child, atomically (it is
  read by polling)."""
  code = (-os.WTERMSIG(status) if os.WIFSIGNALED(status)
          else os.WEXITSTATUS(status))
  path = os.path.join(status_dir, '%d.status' % number)
  with open(path + '.part', 'w') as f:
    f.write(str(code))
  os.rename(path + '.part', path)


def reap(status_dir, children):
  """Writes the status of every child that has ended; children: {PID:
  request number}, of those still running."""
  while True:
    try:
      pid, status = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
      return
    if pid == 0:
      return
    write_status(status_dir, children.pop(pid), status)


def serve(status_dir):
  """Answers requests until the socket closes; returns, in a child, the
  request it is to run."""
  listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
  listener.bind(os.path.join(status_dir, 'socket'))
  listener.listen(16)
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  print('ready', flush=True)
  children = {}
  for number in itertools.count():
    while not select.select([listener], [], [], 0.05)[0]:
      reap(status_dir, children)
    conn, _ = listener.accept()
    with conn, conn.makefile('rw') as stream:
      request = json.loads(stream.readline())
      pid = os.fork()
      if pid == 0:
        listener.close()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        return request
      children[pid] = number
      stream.write('%d %d\n' % (pid, number))


CLONE_NEWNET = 0x40000000


def join_netns(name):
  """Moves this process into the network namespace `ip netns add` made."""
  fd = os.open(os.path.join('/run/netns', name), os.O_RDONLY)
  libc = ctypes.CDLL(None, use_errno=True)
  if libc.setns(fd, CLONE_NEWNET) != 0:
    raise OSError(ctypes.get_errno(), 'setns into network namespace ' + name)
  os.close(fd)


def become(request):
  """Turns this forked child into the requested task, as if started by
  `cd CWD && [ip netns exec NETNS] env ENV python ARGV > LOG 2>&1`."""
  log = os.open(request['log'], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
  os.dup2(log, 1)
  os.dup2(log, 2)
  os.close(log)
  if request.get('netns'):  # After the log: a failure is said there.
    join_netns(request['netns'])
  # One write a line (the server runs unbuffered, which writes a print's
  # text and its newline apart): the task's stdout and its stderr filter
  # share the log, and a line of one must not split a line of the other.
  sys.stdout.reconfigure(line_buffering=True, write_through=False)
  sys.stderr.reconfigure(line_buffering=True, write_through=False)
  os.environ.clear()
  os.environ.update(request['env'])
  os.chdir(request['cwd'])
  sys.argv = list(request['argv'])
  sys.path[0] = os.path.dirname(os.path.realpath(sys.argv[0]))


def main(status_dir):
  preload()
  request = serve(status_dir)
  become(request)
  if request.get('fault'):
    exec(request['fault'], {})  # pylint: disable=exec-used
  import runpy  # pylint: disable=g-import-not-at-top
  runpy.run_path(sys.argv[0], run_name='__main__')


if __name__ == '__main__':
  main(sys.argv[1])
