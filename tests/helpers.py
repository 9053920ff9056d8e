"""What the tests share: the processes a test starts (most from the fork
server: forkserver_client.py), the flags of a cluster, waits, and readers
of checkpoints and logs; and, from suite_env.py, the suite's environment
and free ports.

pytest's fixtures (tiny_data, procs, flags, and the autouse ones) are in
conftest.py, built on these. A test file imports from here (or from
suite_env.py and forkserver_client.py), never from another test file or
from conftest.py. Importing this module sets up the suite's environment
first (suite_env.py).
"""

import contextlib
import glob
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from suite_env import ROOT, TRAINER  # Set up first.
from suite_env import free_ports, suite_env
from forkserver_client import FORK_SERVER, forkable, still_running
import tensorflow as tf  # pylint: disable=g-import-not-at-top,wrong-import-order
from training.runtime import progress  # pylint: disable=g-import-not-at-top

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
    """Kills every process still running, then reaps them: none of them
    is left to run on while another is waited for."""
    running = [p for p in self.procs.values() if still_running(p)]
    for proc in running:
      proc.kill()  # By PID, or the fork server's by pidfd.
    for proc in running:
      try:
        proc.wait(60)
      except RuntimeError:
        pass  # The fork server is gone: it cannot say the status.


def wait_until(predicate, timeout, what, procs):
  """Waits until predicate() is true; fails the test, with the logs' tails,
  if it is not within timeout seconds (a bound against a hang, not a
  measure of speed)."""
  deadline = time.time() + timeout
  while time.time() < deadline:
    if predicate():
      return
    time.sleep(0.2)
  pytest.fail('%s did not happen within %d s; logs:\n%s' % (
      what, timeout, procs.tails() if procs else '(none)'))


@contextlib.contextmanager
def in_group(command, **popen_args):
  """Starts command in a session of its own, its output piped (or where
  popen_args say); yields the Popen and kills the group (it and what it
  started) when the block ends, however it ends."""
  proc = subprocess.Popen(command, start_new_session=True, **dict(
      dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
      **popen_args))
  try:
    yield proc
  finally:
    try:
      os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
    proc.wait()


def run_in_group(command, timeout, **popen_args):
  """Runs a script that starts tasks of its own, in a session of its own;
  kills the group (the script and every task it started) whatever happens.
  Returns (exit status, what it printed)."""
  with in_group(command, **popen_args) as proc:
    try:
      out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
      os.killpg(proc.pid, signal.SIGKILL)
      out = proc.communicate()[0] + '\n(killed: still running after %d s)' % (
          timeout)
  return proc.returncode, out


# A fault (Python run in a worker before the trainer): each of its steps
# lasts at least 0.05 s more, so it takes 20 steps a second at most however
# fast the machine.
PACED = """
import time
from training.session import creator
step = creator.run_step
def paced(*args):
  result = step(*args)
  time.sleep(0.05)
  return result
creator.run_step = paced
"""


@contextlib.contextmanager
def paused(procs, name):
  """Stops task `name` (SIGSTOP: its port still takes connections) for the
  with block, and continues it (SIGCONT) however the block ends: left
  stopped, the tasks that wait on it would wait until killed."""
  procs.procs[name].send_signal(signal.SIGSTOP)
  try:
    yield
  finally:
    procs.procs[name].send_signal(signal.SIGCONT)


def kill9(procs, name):
  """Kills the task `name` with SIGKILL and reaps it."""
  procs.procs[name].kill()
  procs.procs[name].wait()


# Flags and tasks of a run.

# Fast settings for a 2-core machine.
FAST = ['--batch_size=16', '--num_preprocess_threads=2', '--log_frequency=5']
# A worker computing in float16 on a CPU: oneDNN's float16 kernels took 0.96 s
# a step of batch 16 on a Xeon with AVX512-FP16 (Eigen's 0.06 s), and float16
# is checked here for its numbers and its loss scaling, not for its kernels.
FLOAT16_ENV = {'TF_ENABLE_ONEDNN_OPTS': '0'}


def hosts(flags, name):
  """The hosts of --ps_hosts or --worker_hosts (name) in a task's flags."""
  return next(f.split('=', 1)[1] for f in flags
              if f.startswith('--%s=' % name)).split(',')


def cluster_flags(data_dir, train_dir, num_workers=2, num_ps=1):
  """The flags of a cluster on free localhost ports, with FAST settings."""
  ports = free_ports(num_ps + num_workers)
  hosts = ['localhost:%d' % p for p in ports]
  return ['--ps_hosts=' + ','.join(hosts[:num_ps]),
          '--worker_hosts=' + ','.join(hosts[num_ps:]),
          '--data_dir=' + data_dir, '--train_dir=' + train_dir] + FAST


def single_process_flags(data_dir, train_dir):
  """The flags of a one-process run (no cluster), with FAST settings."""
  return ['--ps_hosts=', '--data_dir=' + data_dir,
          '--train_dir=' + train_dir] + FAST


def start_cluster(procs, flags, num_workers=2, num_ps=1, suffix='',
                  tf_config=False, faults=None, worker_env=None):
  """Starts the ps tasks, then the workers from the last to the chief.

  The reference's order (ps, worker 1, worker 0). Process names are ps0..,
  worker0.., each with `suffix` appended. With tf_config, each task gets its
  cluster and role from TF_CONFIG as Kubeflow writes it (a "chief" job, the
  other workers indexed from 0) instead of the four cluster flags. faults:
  {process name: code run before the trainer} (Processes.start), as PACED.
  worker_env: more of the workers' environment (such as FLOAT16_ENV); a
  task with an environment of its own starts without the fork server, so
  not with a fault.
  """
  faults = faults or {}
  tasks = [('ps', i) for i in range(num_ps)] + [
      ('worker', i) for i in reversed(range(num_workers))]
  for job, i in tasks:
    name = '%s%d%s' % (job, i, suffix)
    env = dict(worker_env or {}) if job == 'worker' else {}
    if not tf_config:
      procs.trainer(name, '--job_name=' + job, '--task_index=%d' % i, *flags,
                    fault=faults.get(name), env=env or None)
      continue
    hosts = {f.split('=')[0]: f.split('=')[1].split(',') for f in flags[:2]}
    workers = hosts['--worker_hosts']
    cluster = {'ps': hosts['--ps_hosts'], 'chief': workers[:1],
               'worker': workers[1:]}
    task = ({'type': 'chief', 'index': 0} if job == 'worker' and i == 0 else
            {'type': job, 'index': i - (job == 'worker')})
    env['TF_CONFIG'] = json.dumps({'cluster': cluster, 'task': task})
    procs.trainer(name, *flags[2:], env=env, fault=faults.get(name))


# Checkpoints.

MAX_TO_KEEP = 5  # tf1.train.Saver's default, which the chief's saver has.


def checkpoint_steps(train_dir):
  """Returns (step in the latest checkpoint's name, global_step inside it)."""
  latest = tf.train.latest_checkpoint(train_dir)
  assert latest, 'no checkpoint in %s' % train_dir
  return (int(latest.rsplit('-', 1)[1]),
          int(tf.train.load_variable(latest, 'global_step')))


def latest_step(train_dir):
  """The step in the latest checkpoint's name; -1 when there is none."""
  latest = tf.train.latest_checkpoint(train_dir)
  return int(latest.rsplit('-', 1)[1]) if latest else -1


def checkpoint_step(train_dir):
  """The latest checkpoint's step, checking that its name agrees."""
  name_step, step = checkpoint_steps(train_dir)
  assert name_step == step
  return step


def shard_counts(train_dir, step):
  """Returns the set of N in the step's model.ckpt-STEP.data-*-of-N files."""
  pattern = re.compile(r'^model\.ckpt-%d\.data-\d{5}-of-(\d{5})$' % step)
  return {int(m.group(1)) for m in map(pattern.match, os.listdir(train_dir))
          if m}


def checkpoint_files(train_dir):
  """The steps of the model.ckpt-N checkpoints on disk, in order."""
  return sorted(int(re.search(r'-(\d+)\.index$', p).group(1)) for p in
                glob.glob(os.path.join(train_dir, 'model.ckpt-*.index')))


def listed(train_dir):
  """The steps the `checkpoint` file lists, in its order."""
  state = tf.train.get_checkpoint_state(train_dir)
  return [int(p.rsplit('-', 1)[1]) for p in state.all_model_checkpoint_paths]


# Logs.

# A worker's progress line (its groups: see training/runtime/progress.py).
PROGRESS = progress.PATTERN


def steps(procs, name):
  """The global steps of the progress lines of task `name`, in order."""
  return [line.step for line in progress.parse(procs.log(name))]


def last_step(procs, name):
  """The global step of the last progress line of task `name`; -1: none."""
  found = steps(procs, name)
  return found[-1] if found else -1


# Every line a healthy task prints: the suite's own, nothing of
# TensorFlow's (see training/runtime/log_filter.py).
OWN_LINE = re.compile(
    r'(job_name : \w+|task_index : \d+|(ps|Worker) \d+: .+|Evaluator: .+|'
    r'Cluster from TF_CONFIG: .+|Given on the command line, over TF_CONFIG: .+|'
    r'\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}: step \d+, loss = .+)')


def assert_clean_logs(procs, expected=()):
  """Each task of a healthy run printed only the suite's own lines (and
  the expected ones, an Error line say)."""
  for name in procs.procs:
    log = procs.log(name)
    strange = [l for l in log.splitlines()
               if l not in expected and not OWN_LINE.fullmatch(l)]
    assert not strange, '%s printed lines not ours:\n%s' % (name, log)


# A worker's graph, built in the test's process.


def worker_graph(num_ps, sync, task_index=0, packed=True, loss_scale=None,
                 rule=None):
  """Builds worker task_index's training graph of a cluster of num_ps ps
  tasks (0: one process) and 2 workers, on placeholders of 4 images, not
  run, with the train_graph.UpdateRule rule (None: plain SGD); returns (the
  tf.Graph, its TrainingGraph)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import train_graph  # pylint: disable=g-import-not-at-top
  from training.graph import learning_rate  # pylint: disable=g-import-not-at-top
  tf1 = tf.compat.v1
  graph = tf.Graph()
  cluster = tf.train.ClusterSpec({
      'ps': ['ps%d:1' % i for i in range(num_ps)],
      'worker': ['w0:1', 'w1:1']}) if num_ps else None
  with graph.as_default():
    inputs, variables = train_graph.devices(
        cluster=cluster, task_index=task_index, num_gpus=0)
    with tf1.device(inputs):
      images = tf1.placeholder(tf.float32, [4, 32, 32, 3])
      labels = tf1.placeholder(tf.int32, [4])
    with tf1.device(variables):
      built = train_graph.build(
          images=images, labels=labels, num_ps=num_ps,
          worker=task_index,
          schedule=learning_rate.Schedule('exponential', 0.1, 128, 'none', 0,
                                          100, 100, 0.1),
          sync=(2, 2) if sync else None, loss_scale=loss_scale,
          pack_transfers=packed and bool(num_ps), rule=rule or train_graph.SGD)
  if built.sync_opt:  # Not run here: no "Object was never used" at exit.
    built.sync_opt.ready_for_local_init_op.mark_used()
  return graph, built
