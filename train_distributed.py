"""Distributed CIFAR-10 training with parameter servers, TF1 style.

A ClusterSpec of ps and worker tasks; variables on the ps tasks through
replica_device_setter, compute on each worker's device (one GPU per worker
task when --num_gpus > 0); SyncReplicasOptimizer aggregates the workers'
gradients. Worker 0 is the chief: it initializes or restores the model and
alone writes checkpoints and summaries to --train_dir.

Three terminals, as in the reference (any start order):

  python train_distributed.py --job_name=ps --task_index=0
  python train_distributed.py --job_name=worker --task_index=1
  python train_distributed.py --job_name=worker --task_index=0

Every task stops by itself at --max_steps: the workers stop, then each ps
exits once every worker has told it so. With --ps_hosts= (empty) one worker
trains in this process without a gRPC server.
"""

from datetime import datetime
import json
import logging
import os
import shutil
import signal
import sys
import threading
import time
import warnings

# TensorFlow's C++ start-up chatter buries the progress lines; warnings and
# errors still show. Set TF_CPP_MIN_LOG_LEVEL=0 to see everything.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '1')

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
import tensorflow as tf

import cifar10_eval
import cifar10_input
import cifar10_model
import ps_placement

tf1 = tf.compat.v1

FLAGS = flags.FLAGS

# The reference's flags: same names, same defaults.
flags.DEFINE_string('train_dir', './models_cifar10',
                    'Directory where to write event logs and checkpoint.')
flags.DEFINE_integer('max_steps', 1000000, 'Number of batches to run.')
flags.DEFINE_boolean('log_device_placement', False,
                     'Whether to log device placement.')
flags.DEFINE_integer('batch_size', 128,
                     'Number of images to process in a batch.')
flags.DEFINE_string('data_dir', './cifar-10-batches-bin',
                    'Path to the CIFAR-10 data directory.')
flags.DEFINE_integer('num_gpus', 0,
                     'Total number of gpus for each machine. If you don\'t use '
                     'GPU, please set it to \'0\'. Worker i uses GPU '
                     'i % num_gpus; ps tasks never use a GPU.')
flags.DEFINE_string('ps_hosts', 'localhost:2222',
                    'Comma-separated list of hostname:port pairs. Empty: '
                    'train in one process, without a cluster.')
flags.DEFINE_string('worker_hosts', 'localhost:2223,localhost:2224',
                    'Comma-separated list of hostname:port pairs')
flags.DEFINE_string('job_name', None,
                    'job name: worker or ps; or evaluator, which evaluates '
                    'the chief\'s checkpoints on the test set and needs no '
                    'cluster')
flags.DEFINE_integer('task_index', None, 'Index of task within the job')
flags.DEFINE_boolean('sync_replicas', True,
                     'Whether or not to synchronize the replicas during '
                     'training.')
flags.DEFINE_boolean('existing_servers', False,
                     'Whether servers already exists. If True, will use the '
                     'worker hosts via their GRPC URLs (one client process '
                     'per worker host). Otherwise, will create an in-process '
                     'TensorFlow server.')
flags.DEFINE_integer('replicas_to_aggregate', None,
                     'Number of replicas to aggregate before parameter update '
                     'is applied (For sync_replicas mode only; default: '
                     'num_workers). Fewer than num_workers makes the slowest '
                     'workers backups whose gradients are dropped.')

# Our additions.
flags.DEFINE_integer('save_checkpoint_steps', 100,
                     'The chief writes a checkpoint every this many global '
                     'steps, and at the end.')
flags.DEFINE_integer('save_summaries_steps', 100,
                     'The chief writes TensorBoard summaries every this many '
                     'global steps.')
flags.DEFINE_integer('log_frequency', 10,
                     'Print a progress line every this many local steps.')
flags.DEFINE_integer('num_preprocess_threads', 16,
                     'Threads that read and preprocess images.')
flags.DEFINE_boolean('distort', True,
                     'Augment training images (pad and random crop, flip, '
                     'brightness, contrast). The reference had this off.')
flags.DEFINE_boolean('standardize', True,
                     'Per-image standardization of the input. The reference '
                     'had this off (raw 0..255 pixels).')
flags.DEFINE_float('initial_learning_rate', 0.1, 'Initial learning rate.')
flags.DEFINE_float('num_epochs_per_decay', 350.0,
                   'Epochs after which the learning rate decays.')
flags.DEFINE_float('learning_rate_decay_factor', 0.1,
                   'Learning rate decay factor.')
flags.DEFINE_integer('seed', 0,
                     'Random seed; worker i uses seed + i for its file order, '
                     'shuffling and augmentation.')
flags.DEFINE_boolean('fresh_start', False,
                     'Chief only: delete --train_dir and start over instead '
                     'of resuming from its latest checkpoint.')
flags.DEFINE_integer('intra_op_threads', 0,
                     'Threads each op may use in a worker. 0: the cores of '
                     'this machine divided by the workers listed on the same '
                     'host, so that co-located workers do not fight over '
                     'cores.')
flags.DEFINE_float('eval_interval_secs', 5,
                   'Evaluator: how often to look for a new checkpoint.')
flags.DEFINE_boolean('run_once', False,
                     'Evaluator: evaluate the latest checkpoint and exit.')

# The reference's constants.
MOVING_AVERAGE_DECAY = 0.9999  # Declared, never used, as in the reference.
DROPOUT_KEEP_PROB = 0.8

# How often a worker that waits for the chief to initialize the model looks
# again. The stock session creators poll every 30 s, which a synchronous
# chief then spends waiting for that worker's first gradients.
RECOVERY_WAIT_SECS = 0.5


class UsageError(Exception):
  """A command-line mistake, reported in one line."""


def is_host_port(address):
  """Whether address is 'host:port' with a port of 1-65535."""
  host, _, port = address.rpartition(':')
  return bool(host) and port.isdigit() and 0 < int(port) < 65536


def parse_hosts(value, flag_name):
  """Returns the host:port list of a comma-separated flag value.

  Args:
    value: Flag value, e.g. 'localhost:2222, localhost:2223'.
    flag_name: Name used in error messages.

  Raises:
    UsageError: for an empty entry, a missing host or a bad port.
  """
  if not value.strip():
    return []
  hosts = [h.strip() for h in value.split(',')]
  for host in hosts:
    if not is_host_port(host):
      raise UsageError('--%s=%s: %r is not hostname:port (port 1-65535); '
                       'write e.g. --%s=localhost:2222,localhost:2223' %
                       (flag_name, value, host, flag_name))
  if len(set(hosts)) != len(hosts):
    raise UsageError('--%s=%s lists a host:port twice' % (flag_name, value))
  return hosts


# TF_CONFIG's jobs (as Kubeflow's TFJob writes them) and what each becomes
# here: a chief (or its older name, master) is worker 0 and shifts the
# worker indices by one; an evaluator needs no address.
TF_CONFIG_JOBS = ('chief', 'master', 'worker', 'ps', 'evaluator')
CLUSTER_FLAGS = ('ps_hosts', 'worker_hosts', 'job_name', 'task_index')


def tf_config_flags(text):
  """Returns the cluster flags a TF_CONFIG value describes.

  Args:
    text: The TF_CONFIG value: JSON with "cluster" ({job: [host:port]}) and
      "task" ({"type": job, "index": i}).

  Returns:
    {'ps_hosts': str, 'worker_hosts': str, 'job_name': str,
     'task_index': int}, as they would be given on the command line.

  Raises:
    UsageError: naming what in TF_CONFIG is wrong.
  """
  def bad(problem):
    return UsageError('TF_CONFIG %s; expected e.g. {"cluster": {"ps": '
                      '["host0:2222"], "worker": ["host1:2222"]}, "task": '
                      '{"type": "worker", "index": 0}}' % problem)
  try:
    config = json.loads(text)
  except ValueError as e:
    raise bad('is not valid JSON (%s)' % e)
  if not isinstance(config, dict):
    raise bad('is not a JSON object')
  cluster, task = config.get('cluster'), config.get('task')
  if not isinstance(cluster, dict) or not isinstance(task, dict):
    raise bad('needs a "cluster" object and a "task" object')
  for job, hosts in cluster.items():
    if job not in TF_CONFIG_JOBS:
      raise bad('has a job %r in "cluster": jobs are %s' % (
          job, ', '.join(TF_CONFIG_JOBS)))
    if not isinstance(hosts, list) or not all(
        isinstance(h, str) and is_host_port(h) for h in hosts):
      raise bad('"cluster": {"%s": %s} is not a list of "host:port" (port '
                '1-65535)' % (job, json.dumps(hosts)))
  addresses = [h for hosts in cluster.values() for h in hosts]
  if len(set(addresses)) != len(addresses):
    raise bad('"cluster" lists a host:port twice')
  task_type, index = task.get('type'), task.get('index', 0)
  if task_type not in TF_CONFIG_JOBS:
    raise bad('"task": "type" must be one of %s (got %s)' % (
        ', '.join(TF_CONFIG_JOBS), json.dumps(task_type)))
  if not isinstance(index, int) or isinstance(index, bool) or index < 0:
    raise bad('"task": "index" must be an integer, 0 or more (got %s)' %
              json.dumps(index))
  chief = cluster.get('chief', []) + cluster.get('master', [])
  if len(chief) > 1:
    raise bad('lists %d chief/master tasks: there is at most one' %
              len(chief))
  ps = cluster.get('ps', [])
  if task_type != 'evaluator':
    if not ps:
      raise bad('has no "ps" job: this trainer needs parameter servers')
    if not chief and not cluster.get('worker'):
      raise bad('has no "chief" or "worker" job')
    listed = len(chief if task_type in ('chief', 'master') else
                 cluster.get(task_type, []))
    if index >= listed:
      raise bad('"task": %s %d is not in "cluster", which lists %d' % (
          task_type, index, listed))
  if task_type in ('chief', 'master'):
    job_name = 'worker'
  elif task_type == 'worker':
    job_name, index = 'worker', index + len(chief)
  else:
    job_name = task_type
  return {'ps_hosts': ','.join(ps),
          'worker_hosts': ','.join(chief + cluster.get('worker', [])),
          'job_name': job_name, 'task_index': index}


def apply_tf_config():
  """Sets the cluster flags not given on the command line from TF_CONFIG.

  Flags given explicitly win, so a TF_CONFIG left in the environment cannot
  silently redirect a hand-started task, and one value can be overridden.
  With all four given, TF_CONFIG is not even read.

  Raises:
    UsageError: for a malformed TF_CONFIG that is used.
  """
  text = os.environ.get('TF_CONFIG', '').strip()
  if not text:
    return
  if all(FLAGS[n].present for n in CLUSTER_FLAGS):
    print('TF_CONFIG is set but not used: --%s are all given' %
          ', --'.join(CLUSTER_FLAGS))
    return
  values = tf_config_flags(text)
  taken = [n for n in CLUSTER_FLAGS if not FLAGS[n].present]
  for name in taken:
    FLAGS[name].value = values[name]
  print('Cluster from TF_CONFIG: %s' % ' '.join(
      '--%s=%s' % (n, values[n]) for n in taken))
  kept = [n for n in CLUSTER_FLAGS if n not in taken]
  if kept:
    print('Given on the command line, over TF_CONFIG: %s' % ' '.join(
        '--%s=%s' % (n, FLAGS[n].value) for n in kept))


def check_flags():
  """Validates the flags; returns (job_name, task_index, ps, workers).

  Raises:
    UsageError: with what is wrong and how to fix it.
  """
  apply_tf_config()
  ps_hosts = parse_hosts(FLAGS.ps_hosts, 'ps_hosts')
  worker_hosts = parse_hosts(FLAGS.worker_hosts, 'worker_hosts')
  job_name, task_index = FLAGS.job_name, FLAGS.task_index
  check_positive_flags()
  if job_name == 'evaluator':
    return job_name, task_index or 0, ps_hosts, worker_hosts
  if not ps_hosts:
    # One process, no cluster: the worker hosts are not used.
    job_name = job_name or 'worker'
    task_index = task_index or 0
    if job_name != 'worker' or task_index != 0:
      raise UsageError('with --ps_hosts= (no cluster) the only task is '
                       '--job_name=worker --task_index=0')
    worker_hosts = worker_hosts[:1] or ['localhost:0']
  if job_name not in ('ps', 'worker'):
    raise UsageError('--job_name must be ps, worker or evaluator (got %r)' %
                     job_name)
  num_tasks = len(ps_hosts if job_name == 'ps' else worker_hosts)
  if num_tasks == 0:
    raise UsageError('--worker_hosts is empty: list at least one host:port')
  if task_index is None or not 0 <= task_index < num_tasks:
    raise UsageError('--task_index must be 0..%d for the %d %s task(s) in '
                     '--%s_hosts (got %s)' % (num_tasks - 1, num_tasks,
                                              job_name, job_name, task_index))
  overlap = set(ps_hosts) & set(worker_hosts)
  if overlap:
    raise UsageError('%s is in both --ps_hosts and --worker_hosts' %
                     sorted(overlap)[0])
  if FLAGS.existing_servers and job_name == 'ps':
    raise UsageError('--existing_servers is for workers: a ps task always '
                     'runs its own server')
  replicas = FLAGS.replicas_to_aggregate
  if replicas is not None and not 1 <= replicas <= len(worker_hosts):
    raise UsageError('--replicas_to_aggregate must be 1..%d, the number of '
                     'workers (got %d)' % (len(worker_hosts), replicas))
  if FLAGS.num_gpus < 0:
    raise UsageError('--num_gpus must be 0 or more (got %d)' % FLAGS.num_gpus)
  if FLAGS.num_gpus and job_name == 'worker':
    visible = len(tf.config.list_physical_devices('GPU'))
    if FLAGS.num_gpus > visible:
      raise UsageError('--num_gpus=%d but %d GPU(s) are visible: lower '
                       '--num_gpus or check CUDA_VISIBLE_DEVICES' %
                       (FLAGS.num_gpus, visible))
  return job_name, task_index, ps_hosts, worker_hosts


def check_positive_flags():
  """Raises UsageError for a count flag below 1."""
  for name in ('batch_size', 'max_steps', 'save_checkpoint_steps',
               'save_summaries_steps', 'log_frequency',
               'num_preprocess_threads'):
    if getattr(FLAGS, name) < 1:
      raise UsageError('--%s must be at least 1 (got %d)' %
                       (name, getattr(FLAGS, name)))
  if FLAGS.eval_interval_secs < 0 or FLAGS.intra_op_threads < 0:
    raise UsageError('--eval_interval_secs and --intra_op_threads must be 0 '
                     'or more')


def intra_op_threads(worker_hosts, task_index):
  """Returns the intra-op threads for a worker: its share of the cores.

  Every TensorFlow process sizes its op thread pool to all the cores. Two
  workers on a 2-core machine then run 4 compute threads that preempt each
  other: measured, 1 ps + 2 workers reached 0.82x the images/s of one
  process with 2 threads each and 0.99x with 1 thread each.
  """
  if FLAGS.intra_op_threads:
    return FLAGS.intra_op_threads
  host = worker_hosts[task_index].rpartition(':')[0]
  on_host = sum(1 for h in worker_hosts if h.rpartition(':')[0] == host)
  return max(1, len(os.sched_getaffinity(0)) // on_host)


def session_config(job_name, task_index, worker_hosts=None):
  """Returns the ConfigProto for this task's server and sessions.

  A ps task and every task of a --num_gpus=0 run hide the GPUs, so they never
  allocate GPU memory. A worker sees only its own GPU, task_index % num_gpus,
  and grows its memory as needed, so that workers can share a card.
  Device filters keep a worker from waiting on, or talking to, other workers.

  Args:
    job_name: 'ps' or 'worker'.
    task_index: This task's index.
    worker_hosts: The workers of the cluster; None for a single process.
  """
  config = tf1.ConfigProto(allow_soft_placement=True,
                           log_device_placement=FLAGS.log_device_placement)
  clustered = job_name == 'ps' or worker_hosts is not None
  if job_name == 'worker' and clustered:
    config.intra_op_parallelism_threads = intra_op_threads(worker_hosts,
                                                           task_index)
  if job_name == 'worker' and FLAGS.num_gpus > 0:
    config.gpu_options.allow_growth = True
    config.gpu_options.visible_device_list = str(task_index % FLAGS.num_gpus)
  else:
    config.device_count['GPU'] = 0
  if clustered:
    config.device_filters.extend(
        ['/job:ps'] if job_name == 'worker' else [])
    config.device_filters.append('/job:%s/task:%d' % (job_name, task_index))
  return config


def done_queue(ps_index):
  """The queue on a ps task where each worker posts its index when done.

  The reference's ps blocked in server.join() forever; ours exits once every
  worker has posted to its queue.
  """
  with tf.device('/job:ps/task:%d/cpu:0' % ps_index):
    return tf1.FIFOQueue(-1, tf.int32, shapes=[],
                         shared_name='done_queue_%d' % ps_index,
                         name='done_queue_%d' % ps_index)


def run_ps(cluster, task_index, num_workers):
  """Serves variables until every worker is done; returns the exit status."""
  config = session_config('ps', task_index)
  server = start_server(cluster, 'ps', task_index, config)
  print('ps %d: serving on %s; waiting for %d worker(s) to finish' %
        (task_index, cluster.task_address('ps', task_index), num_workers),
        flush=True)
  with tf.Graph().as_default():
    # This ps's queue alone: its device filter hides the other ps tasks.
    dequeue = done_queue(task_index).dequeue()
    with tf1.Session(server.target, config=config) as sess:
      done = set()
      while len(done) < num_workers:
        done.add(int(sess.run(dequeue)))
  print('ps %d: all %d worker(s) finished; exiting' % (task_index,
                                                      num_workers), flush=True)
  return 0


def start_server(cluster, job_name, task_index, config):
  """Starts this task's gRPC server, or says in one line why it cannot."""
  try:
    return tf1.train.Server(cluster, job_name=job_name, task_index=task_index,
                            config=config)
  except (tf.errors.OpError, ValueError) as e:
    raise UsageError('could not start the %s %d server on %s (is the port '
                     'taken?): %s' % (job_name, task_index,
                                      cluster.task_address(job_name,
                                                           task_index),
                                      str(e).splitlines()[0]))


class SyncReplicasHook(tf1.train.SessionRunHook):
  """SyncReplicasOptimizer's session hook, with a clean start and stop.

  Does what SyncReplicasOptimizer.make_session_run_hook() does: run the local
  init op and, on the chief, fill the token queue and run the sync op
  (aggregate gradients, apply them, hand out tokens) in a thread. The stock
  hook registers that thread with the coordinator; at the end it is blocked
  in take_grad waiting for gradients no worker will send, so
  MonitoredSession.close() waits its 120 s grace period and the thread then
  raises CancelledError. Here the thread is not joined: it ends when the
  session closes, and counts that as a normal end. So does a lost ps, from
  which the training loop recovers; another error is passed to the
  coordinator, which raises it in the training loop.
  """

  def __init__(self, opt, is_chief):
    self._is_chief = is_chief
    if is_chief:
      self._local_init_op = opt.chief_init_op
      self._init_tokens_op = opt.get_init_tokens_op()
      self._sync_op = opt.get_chief_queue_runner().enqueue_ops[0]
    else:
      self._local_init_op = opt.local_step_init_op

  def after_create_session(self, session, coord):
    session.run(self._local_init_op)
    if self._is_chief:
      session.run(self._init_tokens_op)
      threading.Thread(target=self._run_sync_op, args=(session, coord),
                       daemon=True, name='sync_replicas').start()

  def _run_sync_op(self, session, coord):
    try:
      while not coord.should_stop():
        session.run(self._sync_op)
    except (tf.errors.CancelledError, tf.errors.OutOfRangeError, RuntimeError):
      pass  # The session or the token queue was closed: training is over.
    except (tf.errors.UnavailableError, tf.errors.AbortedError):
      # A ps went away. The training loop's own step fails the same way and
      # MonitoredSession recovers; reported to the coordinator, this error
      # would be raised again when the broken session closes, and kill us.
      pass
    except Exception as e:  # pylint: disable=broad-except
      coord.request_stop(e)


class ReportLostTask(logging.Filter):
  """Turns TensorFlow's note that a task was lost into one line on stderr.

  When a ps or the chief goes away, MonitoredSession catches the
  UnavailableError or AbortedError, logs it at INFO level (below what we
  show) and waits, inside the close of the broken session, for the task to
  come back. This filter on TensorFlow's logger is the one place that hears
  of it when it happens; everything else stays hidden as before.
  """

  PREFIX = 'An error was raised. This may be due to a preemption'

  def filter(self, record):
    if record.levelno >= logging.ERROR:
      return True
    message = record.getMessage()
    if message.startswith(self.PREFIX):
      error = message.rsplit('Error: ', 1)[-1].strip().splitlines()[0]
      print('Worker %d: lost a task of the cluster (%s); waiting for it to '
            # Read now: TF_CONFIG may have set it after this was made.
            'come back' % (FLAGS.task_index or 0, error), file=sys.stderr,
            flush=True)
    return False


class SessionCreator(tf1.train.SessionCreator):
  """ChiefSessionCreator / WorkerSessionCreator with a short recovery wait.

  The stock creators build a SessionManager that polls every 30 s: a worker
  started before the chief has initialized the model sleeps 30 s before it
  looks again, and a synchronous chief's first step waits for it.
  """

  def __init__(self, scaffold, master, config, is_chief, checkpoint_dir):
    self._scaffold = scaffold
    self._master = master
    self._config = config
    self._is_chief = is_chief
    self._checkpoint_dir = checkpoint_dir
    self._sessions = 0

  def create_session(self):
    # MonitoredSession calls this again once a lost task is back (see
    # ReportLostTask): a restarted ps has lost its variables.
    if self._sessions:
      print('Worker %d: the cluster is back; %s' % (
          FLAGS.task_index or 0,
          'restoring the latest checkpoint' if self._is_chief else
          'waiting for the chief to restore the model'),
            file=sys.stderr, flush=True)
    self._sessions += 1
    self._scaffold.finalize()
    manager = tf1.train.SessionManager(
        local_init_op=self._scaffold.local_init_op,
        ready_op=self._scaffold.ready_op,
        ready_for_local_init_op=self._scaffold.ready_for_local_init_op,
        graph=tf1.get_default_graph(),
        recovery_wait_secs=RECOVERY_WAIT_SECS)
    if not self._is_chief:
      return manager.wait_for_session(self._master, config=self._config)
    session = manager.prepare_session(
        self._master, saver=self._scaffold.saver,
        checkpoint_dir=self._checkpoint_dir, config=self._config,
        init_op=self._scaffold.init_op)
    if self._sessions > 1:  # Where the cluster starts again from.
      print('Worker 0: restored the model at global step %d' % session.run(
          tf1.train.get_global_step()), file=sys.stderr, flush=True)
    return session


class StopOnSignal(tf1.train.SessionRunHook):
  """SIGINT or SIGTERM: the chief writes a checkpoint; the task exits now.

  Python runs a signal handler only between bytecodes, and a worker can sit
  inside session.run for as long as another worker is down (synchronous
  training waits for its gradients), so a handler alone could wait forever.
  The C-level handler still writes the signal number to the wakeup fd, and a
  thread reading it saves and exits while the main thread stays blocked.

  A single process first lets its step in flight end and starts no other
  (this is the last hook, so the other hooks' saves are done too): its
  checkpoint is exactly the model of the step it is named after. In a
  cluster, the chief's sync thread and the other workers may apply a step
  between the read of the global step that names the checkpoint and the
  save, as with TensorFlow's own CheckpointSaverHook: the checkpoint is a
  snapshot and may hold a later step than its name. A second signal exits
  at once, without waiting for the save.
  """

  # How long a single process waits for its step in flight before it saves
  # anyway: a step that raised never reports its end.
  STEP_WAIT_SECS = 30

  def __init__(self, name, scaffold=None, train_dir=None, global_step=None,
               wait_for_step=False):
    """Starts watching for the signals.

    Args:
      name: This task, for the message: 'Worker 0', 'Evaluator'.
      scaffold: The chief's Scaffold, whose saver writes the checkpoint;
        None on other workers, which only exit.
      train_dir: Where the checkpoint goes.
      global_step: The global step tensor, which names the checkpoint.
      wait_for_step: Whether to let the step in flight finish first; only
        where nothing else changes the variables (a single process).
    """
    self._name = name
    self._scaffold, self._train_dir = scaffold, train_dir
    self._global_step = global_step
    self._wait_for_step = wait_for_step
    # Guards the two below: whether a step is running, whether to stop.
    self._step_state = threading.Condition()
    self._in_step = self._stopping = False
    self._session = None
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.set_wakeup_fd(write_fd)
    for signum in (signal.SIGINT, signal.SIGTERM):
      signal.signal(signum, lambda *_: None)  # The wakeup fd carries it.
    threading.Thread(target=self._watch, args=(read_fd,), daemon=True,
                     name='stop_on_signal').start()

  def after_create_session(self, session, coord):
    self._session = session

  def before_run(self, run_context):
    if not self._wait_for_step:
      return  # In a cluster the steps are not held up: no lock per step.
    with self._step_state:
      # Once a signal came, the main thread waits here for the exit.
      self._step_state.wait_for(lambda: not self._stopping)
      self._in_step = True

  def after_run(self, run_context, run_values):
    if not self._wait_for_step:
      return
    with self._step_state:
      self._in_step = False
      self._step_state.notify_all()

  def _watch(self, read_fd):
    signum = os.read(read_fd, 1)[0]
    threading.Thread(target=lambda: os._exit(128 + os.read(read_fd, 1)[0]),
                     daemon=True, name='second_signal').start()
    message = '%s: %s' % (self._name, signal.Signals(signum).name)
    if self._scaffold is not None and self._session is not None:
      if self._wait_for_step:
        with self._step_state:
          self._stopping = True
          self._step_state.wait_for(lambda: not self._in_step,
                                    timeout=self.STEP_WAIT_SECS)
      try:
        path = self._scaffold.saver.save(
            self._session, os.path.join(self._train_dir, 'model.ckpt'),
            global_step=self._global_step)
        message += ': wrote %s' % path
      except Exception as e:  # pylint: disable=broad-except
        message += ': could not write a checkpoint (%s)' % (
            str(e).splitlines()[0])
    print(message + '; exiting', file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(128 + signum)  # The main thread may be blocked in a step.


def prepare_train_dir(train_dir, is_chief):
  """Makes train_dir; the chief empties it first with --fresh_start."""
  action = 'create'
  try:
    if is_chief and FLAGS.fresh_start and os.path.exists(train_dir):
      action = 'delete'
      print('Worker 0: --fresh_start: deleting %s' % train_dir)
      shutil.rmtree(train_dir)
      action = 'create'
    os.makedirs(train_dir, exist_ok=True)
  except OSError as e:
    raise UsageError('cannot %s --train_dir=%s: %s' % (action, train_dir,
                                                      e.strerror))
  if is_chief and not os.access(train_dir, os.W_OK | os.X_OK):
    raise UsageError('--train_dir=%s is not writable: choose another '
                     'directory or fix its permissions' % train_dir)


def check_checkpoint_matches(train_dir):
  """Raises UsageError if train_dir's checkpoint is of a different model.

  Restoring it would fail deep inside the session with a long traceback;
  the chief checks the names and shapes of its global variables first.
  """
  latest = tf.train.latest_checkpoint(train_dir)
  if not latest:
    return
  try:
    saved = dict(tf.train.list_variables(latest))
  except (tf.errors.OpError, ValueError) as e:
    raise UsageError('cannot read the checkpoint %s (%s): use another '
                     '--train_dir or --fresh_start' % (
                         latest, str(e).splitlines()[0]))
  for var in tf1.global_variables():
    name, shape = ps_placement.saved_name_and_shape(var)
    if saved.get(name) != shape:
      raise UsageError(
          '--train_dir=%s holds a checkpoint of a different model (%s: %s '
          'in the checkpoint, %s here): use another --train_dir, or '
          '--fresh_start to delete it' % (train_dir, name,
                                          saved.get(name, 'missing'), shape))


def learning_rate(global_step, num_train_records, examples_per_step):
  """The reference's staircase schedule, counting real examples per step.

  In synchronous training a global step consumes replicas_to_aggregate
  batches; in asynchronous training, one.
  """
  steps_per_epoch = num_train_records / float(examples_per_step)
  decay_steps = max(1, int(steps_per_epoch * FLAGS.num_epochs_per_decay))
  return tf1.train.exponential_decay(FLAGS.initial_learning_rate, global_step,
                                     decay_steps,
                                     FLAGS.learning_rate_decay_factor,
                                     staircase=True)


def main(_):
  tf1.disable_eager_execution()  # Queue runners need graph mode.
  # TensorFlow's Python log shows errors only: the TF1 API we keep on
  # purpose (queues, slim layers) warns once per call site, on every start,
  # which tells a user nothing. The exception is the INFO note that a task
  # of the cluster was lost, which ReportLostTask turns into one line.
  tf.get_logger().setLevel('INFO')
  tf.get_logger().addFilter(ReportLostTask())
  warnings.filterwarnings('ignore', message='`layer.apply` is deprecated')
  try:
    return train()
  except (UsageError, cifar10_input.DataError) as e:
    print('Error: %s' % e, file=sys.stderr)
    return 2


def train():
  """Runs this task; returns the process exit status."""
  job_name, task_index, ps_hosts, worker_hosts = check_flags()
  num_workers = len(worker_hosts)
  print('job_name : %s' % job_name)
  print('task_index : %d' % task_index)
  cluster = None
  if ps_hosts:
    cluster = tf.train.ClusterSpec({'ps': ps_hosts, 'worker': worker_hosts})
  if job_name == 'ps':
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # Nothing to save: just go.
    return run_ps(cluster, task_index, num_workers)
  if job_name == 'evaluator':
    StopOnSignal('Evaluator')
    return cifar10_eval.run(FLAGS.train_dir, FLAGS.data_dir, FLAGS.batch_size,
                            FLAGS.standardize, FLAGS.max_steps,
                            FLAGS.eval_interval_secs, FLAGS.run_once)

  is_chief = task_index == 0
  sync = FLAGS.sync_replicas and cluster is not None
  replicas_to_aggregate = FLAGS.replicas_to_aggregate or num_workers
  # Checkpoint shards are written by the ps processes: give them an
  # absolute path, not one relative to their working directory.
  train_dir = os.path.abspath(FLAGS.train_dir)

  # Placement: the input pipeline on this worker's CPU; the model on its
  # GPU or CPU; variables spread over the ps tasks.
  if cluster is None:
    input_device = '/cpu:0'
    worker_device = '/device:GPU:0' if FLAGS.num_gpus else '/cpu:0'
    variable_device = tf1.device(worker_device)
  else:
    input_device = '/job:worker/task:%d/cpu:0' % task_index
    worker_device = '/job:worker/task:%d%s' % (
        task_index, '/device:GPU:0' if FLAGS.num_gpus else '/cpu:0')
    variable_device = tf1.device(ps_placement.device_setter(cluster,
                                                           worker_device))

  tf1.set_random_seed(FLAGS.seed + task_index)
  with tf.device(input_device):
    images, labels = cifar10_input.generate_batch_inputs(
        eval_data=False, shuffle=True, data_dir=FLAGS.data_dir,
        batch_size=FLAGS.batch_size,
        num_preprocess_threads=FLAGS.num_preprocess_threads,
        distort=FLAGS.distort, standardize=FLAGS.standardize,
        seed=FLAGS.seed + task_index)
  num_train_records = cifar10_input.num_records(FLAGS.data_dir, False)

  with variable_device:
    global_step = tf1.train.get_or_create_global_step()
    with tf1.variable_scope('', partitioner=ps_placement.partitioner(
        len(ps_hosts))):
      logits = cifar10_model.inference(images, is_training=True,
                                       dropout_keep_prob=DROPOUT_KEEP_PROB)
    loss = cifar10_model.loss(logits, labels)
    accuracy = tf.reduce_mean(tf.cast(
        tf1.nn.in_top_k(logits, labels, 1), tf.float32), name='accuracy')
    examples_per_step = FLAGS.batch_size * (replicas_to_aggregate if sync
                                            else 1)
    lr = learning_rate(global_step, num_train_records, examples_per_step)
    opt = tf1.train.GradientDescentOptimizer(lr)
    if sync:
      opt = tf1.train.SyncReplicasOptimizer(
          opt, replicas_to_aggregate=replicas_to_aggregate,
          total_num_replicas=num_workers, name='cifar10_sync_replicas')
    minimize = opt.minimize(loss, global_step=global_step)
    # BatchNorm moving statistics get one update per global step, as in a
    # single process: from each step of an asynchronous worker, and in
    # synchronous training from the chief only (the others' updates would
    # land on the ps unaggregated, N times per global step).
    update_ops = tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)
    train_op = tf.group(minimize, *(update_ops if is_chief or not sync
                                    else []), name='train_op')
    with tf.control_dependencies([train_op]):
      # The step this training step reached: read after it, not beside it.
      step_after = global_step.read_value()
    tf1.summary.scalar('loss', loss)
    tf1.summary.scalar('accuracy', accuracy)
    tf1.summary.scalar('learning_rate', lr)

  if cluster is not None:
    post_done = tf.group(*[done_queue(i).enqueue(task_index)
                           for i in range(len(ps_hosts))])
    close_tokens = (opt.get_chief_queue_runner().queue.close(
        cancel_pending_enqueues=True) if sync and is_chief else tf.no_op())

  config = session_config('worker', task_index,
                          worker_hosts if cluster else None)
  if cluster is None:
    master = ''
  elif FLAGS.existing_servers:
    master = 'grpc://' + worker_hosts[task_index]
    print('Using existing server at: %s' % master)
  else:
    master = start_server(cluster, 'worker', task_index, config).target
  # Only now, with the data checked and the port ours, touch train_dir: a
  # mistake on the command line must not cost a --fresh_start deletion.
  prepare_train_dir(train_dir, is_chief)
  if is_chief:
    check_checkpoint_matches(train_dir)
    if cluster is not None:
      for line in ps_placement.describe_loads(tf1.global_variables(),
                                              len(ps_hosts)):
        print('Worker 0: %s' % line)

  # The sync optimizer's own readiness check: all global variables exist.
  scaffold = tf1.train.Scaffold(
      ready_for_local_init_op=opt.ready_for_local_init_op if sync else None)
  hooks = [tf1.train.NanTensorHook(loss),  # First: nothing saves a NaN step.
           tf1.train.StopAtStepHook(last_step=FLAGS.max_steps)]
  if sync:
    hooks.append(SyncReplicasHook(opt, is_chief))
  if is_chief:
    hooks += [tf1.train.CheckpointSaverHook(
        train_dir, save_steps=FLAGS.save_checkpoint_steps, scaffold=scaffold),
              tf1.train.SummarySaverHook(
                  save_steps=FLAGS.save_summaries_steps, output_dir=train_dir,
                  scaffold=scaffold)]
    print('Worker %d: Initializing session...' % task_index)
    latest = tf.train.latest_checkpoint(train_dir)
    if latest:
      print('Worker 0: resuming from %s' % latest)
  else:
    print('Worker %d: Waiting for session to be initialized...' % task_index)
  # Last: its after_run comes after every other hook's checkpoint writes.
  hooks.append(StopOnSignal('Worker %d' % task_index,
                            *((scaffold, train_dir, global_step) if is_chief
                              else ()),
                            wait_for_step=cluster is None))
  sys.stdout.flush()

  creator = SessionCreator(scaffold, master, config, is_chief, train_dir)
  final_step = None
  try:
    with tf1.train.MonitoredSession(session_creator=creator,
                                    hooks=hooks) as sess:
      print('Worker %d: Session initialization complete.' % task_index,
            flush=True)
      run_loop(sess, [step_after, loss, accuracy], is_chief, train_dir)
  except tf1.train.NanLossDuringTrainingError:
    print('Error: the model diverged with loss = NaN; the last good '
          'checkpoint in %s is kept. Lower --initial_learning_rate and '
          'restart.' % train_dir, file=sys.stderr)
    return 1
  finally:
    if cluster is not None:
      final_step = tell_cluster_done(master, config, close_tokens, post_done,
                                     global_step)
  if cluster is None:
    final_step = tf.train.load_variable(train_dir, 'global_step')
  if final_step is None:
    return 1
  print('Worker %d: training finished at global step %d' % (task_index,
                                                            final_step),
        flush=True)
  return 0 if final_step >= FLAGS.max_steps else 1


def run_loop(sess, fetches, is_chief, train_dir):
  """Runs training steps until a hook stops the session; prints progress.

  Args:
    sess: The MonitoredSession.
    fetches: [global step after the train op, loss, accuracy]; running the
      first runs the train op.
    is_chief: Whether to write examples/sec summaries.
    train_dir: Where the chief's summaries go.
  """
  writer = tf1.summary.FileWriterCache.get(train_dir) if is_chief else None
  local_step = 0
  start = time.time()
  while not sess.should_stop():
    step, loss_value, accuracy_value = sess.run(fetches)
    local_step += 1
    if local_step % FLAGS.log_frequency == 0:
      duration = time.time() - start
      start = time.time()
      examples_per_sec = FLAGS.log_frequency * FLAGS.batch_size / duration
      print('%s: step %d, loss = %.2f ,Train accuracy = %.2f '
            '(%.1f examples/sec; %.3f sec/batch)' %
            (datetime.now(), step, loss_value, accuracy_value,
             examples_per_sec, duration / FLAGS.log_frequency), flush=True)
      if writer:
        writer.add_summary(tf1.Summary(value=[tf1.Summary.Value(
            tag='examples/sec', simple_value=examples_per_sec)]), step)
    if step >= FLAGS.max_steps:
      # The step this run reached, read after it: in asynchronous training
      # StopAtStepHook's estimate (the step before the run, plus one) lags
      # behind the other workers' updates and lets a worker overshoot.
      break


def tell_cluster_done(master, config, close_tokens, post_done, global_step):
  """Releases the other workers, tells each ps, returns the global step.

  The chief of a synchronous run closes the token queue, so that workers
  blocked waiting for a token stop instead of hanging. Every worker then
  posts to each ps's done queue; a ps exits when all workers have posted.
  Returns None when the cluster cannot be reached.
  """
  try:
    with tf1.Session(master, config=config) as sess:
      sess.run(close_tokens)
      step = sess.run(global_step)
      sess.run(post_done)
      return int(step)
  except tf.errors.OpError as e:
    print('Warning: could not tell the ps tasks that this worker is done: '
          '%s' % str(e).splitlines()[0], file=sys.stderr)
    return None


if __name__ == '__main__':
  app.run(main)
