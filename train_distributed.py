"""Distributed CIFAR-10 training with parameter servers, TF1 style.

A ClusterSpec of ps and worker tasks; variables spread over the ps tasks
through replica_device_setter, compute on each worker's device (one GPU per
worker task when --num_gpus > 0); SyncReplicasOptimizer aggregates the
workers' gradients. Worker 0 is the chief: it initializes or restores the
model, saves the checkpoints (each ps writes the shard of its variables) and
writes the summaries.

It holds the reference's flags and reads them, top to bottom as
mnist_replica.py does: flags, the ClusterSpec, this task's Server, the
graph (train_graph.py: replica_device_setter, the model,
SyncReplicasOptimizer), the MonitoredSession and its loop. The machinery
around them lives in the training/ package (docs/code.md).

Three terminals, as in the reference (any start order):

  python train_distributed.py --job_name=ps --task_index=0
  python train_distributed.py --job_name=worker --task_index=1
  python train_distributed.py --job_name=worker --task_index=0

Every task stops by itself at --max_steps (each ps once every worker said it
is done). With --ps_hosts= (empty) one worker trains, without a gRPC server.
"""

from datetime import datetime
import os
import re
import signal
import sys
import time

from training import log_filter

# Before TensorFlow loads: its C++ chatter would bury the suite's lines (and
# TF_CPP_MIN_LOG_LEVEL alone cannot hide it). Real warnings and errors still
# show; TF_CPP_MIN_LOG_LEVEL=0 shows everything. Not when imported (by a
# test): the importer's stderr is its own. And no Keras 3 (unused: tf-slim
# has TensorFlow's own Keras 2 layers): a task starts 1-2 s sooner.
if __name__ == '__main__':
  log_filter.install()
  os.environ.setdefault('TF_USE_LEGACY_KERAS', '1')

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
import tensorflow as tf

from training import checkpoints
import cifar10_eval
from training import data_layout
import cifar10_input
import cifar10_model
from training import cluster_config
from training import cluster_runtime
from training import precision
from training import learning_rate
import train_graph
from training import hooks as session_hooks
from training import session
from training import worker_hooks

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
flags.DEFINE_integer('num_gpus', 0, 'Total number of gpus for each machine. '
                     'If you don\'t use GPU, please set it to \'0\'. Worker '
                     'i uses GPU i % num_gpus; ps tasks never use a GPU.')
flags.DEFINE_string('ps_hosts', 'localhost:2222',
                    'Comma-separated list of hostname:port pairs. Empty: '
                    'train in one process, without a cluster.')
flags.DEFINE_string('worker_hosts', 'localhost:2223,localhost:2224',
                    'Comma-separated list of hostname:port pairs')
flags.DEFINE_string('job_name', None, 'job name: worker or ps; or evaluator, '
                    'which evaluates the chief\'s checkpoints on the test '
                    'set and needs no cluster')
flags.DEFINE_integer('task_index', None, 'Index of task within the job')
flags.DEFINE_boolean('sync_replicas', True, 'Whether or not to synchronize '
                     'the replicas during training.')
flags.DEFINE_boolean('existing_servers', False,
                     'Whether servers already exists. If True, will use the '
                     'worker hosts via their GRPC URLs (one client process '
                     'per worker host). Otherwise, will create an in-process '
                     'TensorFlow server. That server was started with its '
                     'own GPU and thread settings: this process\'s '
                     '--num_gpus and --intra_op_threads do not apply to it.')
flags.DEFINE_integer('replicas_to_aggregate', None,
                     'Number of replicas to aggregate before parameter update '
                     'is applied (For sync_replicas mode only; default: '
                     'num_workers). Fewer than num_workers makes the slowest '
                     'workers backups whose gradients are dropped.')

# Our additions.
flags.DEFINE_integer('save_checkpoint_steps', 100,
                     'The chief writes a checkpoint every this many global '
                     'steps, and at the end.')
flags.DEFINE_integer('save_summaries_steps', 100, 'The chief writes '
                     'TensorBoard summaries every this many global steps.')
flags.DEFINE_integer('log_frequency', 10,
                     'Print a progress line every this many local steps.')
flags.DEFINE_integer('num_preprocess_threads', 16,
                     'Threads that read and preprocess images.')
flags.DEFINE_boolean('distort', True,
                     'Augment training images (pad and random crop, flip, '
                     'brightness, contrast). The reference had this off.')
flags.DEFINE_integer('crop_padding', cifar10_input.PAD_PIXELS,
                     'With --distort: the most pixels a crop shifts; 0: none.')
flags.DEFINE_boolean('standardize', True, 'Per-image standardization of the '
                     'input. The reference had this off (raw 0..255 pixels).')
flags.DEFINE_float('initial_learning_rate', 0.1, 'Initial learning rate.')
flags.DEFINE_float('num_epochs_per_decay', 350.0,
                   'Epochs after which the learning rate decays.')
flags.DEFINE_float('learning_rate_decay_factor', 0.1,
                   'Learning rate decay factor.')
flags.DEFINE_enum('lr_schedule', 'exponential', learning_rate.SCHEDULES,
                  'exponential: the reference\'s decay (flags above); '
                  'cosine: from the initial rate to 0 at --max_steps.')
flags.DEFINE_integer('warmup_steps', 0, 'Steps of linear warmup.')
flags.DEFINE_enum('lr_scaling', 'none', learning_rate.SCALINGS, 'linear: '
                  '--initial_learning_rate is for 128 examples per update, '
                  'and scales with the examples an update aggregates.')
flags.DEFINE_integer('seed', 0, 'Random seed; worker i uses seed + i for its '
                     'file order, shuffling and augmentation.')
flags.DEFINE_boolean('fresh_start', False, 'Chief only: delete --train_dir and '
                     'start over instead of resuming its latest checkpoint.')
flags.DEFINE_boolean('new_data', False, 'Chief: resume a --train_dir trained '
                     'on other data (to fine-tune); the new data is recorded.')
flags.DEFINE_integer('intra_op_threads', 0, 'Threads each op may use in a '
                     'worker; 0: the cores here divided by the workers listed '
                     'on this host, so that they do not fight over cores.')
flags.DEFINE_float('eval_interval_secs', 5,
                   'Evaluator: how often to look for a new checkpoint.')
flags.DEFINE_boolean('run_once', False,
                     'Evaluator: evaluate the latest checkpoint and exit.')
flags.DEFINE_boolean('mixed_precision', False,
                     'Worker: compute in bfloat16 on a CPU, float16 on a GPU; '
                     'variables and checkpoints stay float32.')
flags.DEFINE_enum('mixed_precision_dtype', 'auto',
                  ['auto', 'bfloat16', 'float16'],
                  'With --mixed_precision; float16 on a CPU runs its CPU '
                  'kernels, no faster: to check float16 before a GPU run.')
flags.DEFINE_float('initial_loss_scale', 32768.0, 'Worker, with float16: the '
                   'loss scale to start from (TensorFlow\'s default).')
flags.DEFINE_integer('loss_scale_period', 2000, 'Worker, with float16: good '
                     'steps in a row that double the loss scale.')
flags.DEFINE_integer('wait_report_secs', 10, 'Seconds a task waits for '
                     'another before it names it; again every twice that.')
flags.DEFINE_enum('transfer_dtype', 'float32', ['float32', 'bfloat16'],
                  'Worker in a cluster: what weights and gradients cross the '
                  'network as; the ps accumulates and applies in float32.')
flags.DEFINE_integer('lost_worker_secs', 10, 'Chief and ps: seconds a '
                     'worker\'s port refuses connections before it counts as '
                     'lost for good: its share of each update goes to the '
                     'others, and no ps waits for it at the end.')
flags.DEFINE_boolean('pack_transfers', True, 'Worker in a cluster: send each '
                     'kind of tensor once per ps a step (weights, gradients, '
                     'BatchNorm statistics); --nopack_transfers runs the '
                     'article\'s plain graph, to read or compare.')
flags.DEFINE_list('trace_steps', [], 'Worker: its own steps (from 1) to '
                  'write a Chrome trace of, into --train_dir, e.g. 50,51.')


def require(name, holds, what):
  """An absl validator: --name must be what, said with the value given."""
  def check(value):
    if not holds(value):
      raise flags.ValidationError('--%s must be %s (got %s)' % (
          name, what, ','.join(value) if isinstance(value, list) else value))
    return True
  flags.register_validator(name, check)


for _name in ('batch_size', 'max_steps', 'save_checkpoint_steps',
              'save_summaries_steps', 'log_frequency',
              'num_preprocess_threads', 'loss_scale_period',
              'wait_report_secs', 'lost_worker_secs'):
  require(_name, lambda v: v >= 1, 'at least 1')
for _name in ('eval_interval_secs', 'intra_op_threads', 'num_gpus',
              'warmup_steps', 'crop_padding'):
  require(_name, lambda v: v >= 0, '0 or more')
require('initial_loss_scale', lambda v: v > 0, 'more than 0')  # NaN neither.
require('trace_steps', lambda v: all(s.isdigit() and int(s) >= 1 for s in v),
        'step numbers from 1, e.g. 50,51')


def parse_flags(argv):
  """absl's parsing; a value our validators refuse is one Error: line and
  exit status 2, as every other mistake on the command line here."""
  try:
    return FLAGS(argv)
  except flags.Error as e:
    # absl says 'flag --NAME=VALUE: MESSAGE'; our messages name the flag.
    mine = re.match(r'flag --[^=]+=.*?: (--.*)', str(e), re.S)
    if mine:
      print('Error: %s' % mine.group(1), file=sys.stderr)
      sys.exit(2)
  return app.parse_flags_with_usage(argv)  # absl's words and exit status.


def apply_tf_config():
  """Sets the cluster flags not given on the command line from TF_CONFIG."""
  given = {n: FLAGS[n].value for n in cluster_config.CLUSTER_FLAGS
           if FLAGS[n].present}
  values, lines = cluster_config.tf_config_updates(
      os.environ.get('TF_CONFIG', ''), given)
  for name, value in values.items():
    FLAGS[name].value = value
  for line in lines:
    print(line)


def check_flags():
  """Validates the flags; returns this process's cluster_config.Task.

  Raises:
    cluster_config.UsageError: with what is wrong and how to fix it.
  """
  apply_tf_config()
  if FLAGS.transfer_dtype != 'float32' and not FLAGS.pack_transfers:
    raise cluster_config.UsageError(
        '--transfer_dtype=%s needs the packed transfers: drop '
        '--nopack_transfers or --transfer_dtype' % FLAGS.transfer_dtype)
  task = cluster_config.resolve_task(
      FLAGS.job_name, FLAGS.task_index, FLAGS.ps_hosts, FLAGS.worker_hosts,
      FLAGS.replicas_to_aggregate, FLAGS.existing_servers)
  if task.job_name == 'worker':
    compute_dtype()  # Its flags' mistakes first: they name the fix.
    cluster_runtime.check_devices(FLAGS.num_gpus)
  return task


def compute_dtype():
  """What the worker computes in: None (float32), bfloat16 or float16."""
  return precision.compute_dtype(
      FLAGS.mixed_precision, FLAGS.mixed_precision_dtype, FLAGS.num_gpus)


def main(_):
  tf1.disable_eager_execution()  # Queue runners need graph mode.
  # TensorFlow's Python log: errors (the TF1 API we keep warns at every
  # start), and the INFO note of a lost task, which ReportLostTask shortens.
  tf.get_logger().setLevel('INFO')
  try:
    status = train()
  except (cluster_config.UsageError, cifar10_input.DataError,
          checkpoints.TrainDirError, checkpoints.WriteError) as e:
    print('Error: %s' % e, file=sys.stderr)
    status = 2  # (3, a ps lost at the last save: CheckpointSaverHook.)
  # All is written (the summary hook flushed; a ps waited for the workers
  # to exit): skip Python's 1.4-1.6 s teardown of TensorFlow.
  session.exit_now(status)


def train():
  """Runs this task; returns the process exit status."""
  task = check_flags()
  cluster_runtime.report_waits_after(FLAGS.wait_report_secs)
  tf.get_logger().addFilter(session.ReportLostTask(task.task_index))
  print('job_name : %s' % task.job_name)
  print('task_index : %d' % task.task_index)
  cluster = (tf.train.ClusterSpec({'ps': task.ps_hosts,
                                   'worker': task.worker_hosts})
             if task.ps_hosts else None)  # None: one process, no server.
  if task.job_name == 'ps':
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # Nothing to save: just go.
    return cluster_runtime.run_ps(cluster, task.task_index,
                                  lost_secs=FLAGS.lost_worker_secs)
  if task.job_name == 'evaluator':
    session_hooks.StopOnSignalHook('Evaluator')
    return cifar10_eval.run(FLAGS.train_dir, FLAGS.data_dir, FLAGS.batch_size,
                            FLAGS.standardize, FLAGS.max_steps,
                            FLAGS.eval_interval_secs, FLAGS.run_once)
  return train_worker(task, cluster)


def train_worker(task, cluster):
  """Trains as worker task.task_index; returns the exit status."""
  task_index, is_chief = task.task_index, task.task_index == 0
  # Checkpoint shards are written by the ps processes: give them an
  # absolute path, not one relative to their working directory.
  train_dir = os.path.abspath(FLAGS.train_dir)
  config = cluster_runtime.session_config(
      'worker', task_index, task.worker_hosts if cluster else None,
      FLAGS.num_gpus, FLAGS.intra_op_threads, FLAGS.log_device_placement,
      compute_dtype())
  # The Server: this worker's gRPC server, started here (or, with
  # --existing_servers, one already running); '' in one process.
  master = cluster_runtime.session_target(task, cluster, config,
                                          FLAGS.existing_servers)
  graph = build_graph(task, cluster)
  line = (precision.mixed_precision_line(
      task_index, compute_dtype(), FLAGS.num_gpus) if compute_dtype() else
          precision.mixed_precision_hint(task_index, FLAGS.num_gpus))
  if line:  # Without the flag, a line only where it would pay.
    print(line)
  # Only now, with the data checked and the port ours, touch train_dir: a
  # mistake on the command line must not cost a --fresh_start deletion.
  checkpoints.prepare(train_dir, is_chief, FLAGS.fresh_start)
  shadows = cifar10_model.averages_of_weights()
  resume = (session.chief_start(
      train_dir, data_layout.identity(FLAGS.data_dir), FLAGS.new_data,
      FLAGS.max_steps, len(task.ps_hosts), graph.schedule, shadows)
            if is_chief else None)
  scaffold = train_graph.scaffold(graph)
  hooks = worker_hooks.in_order(
      graph=graph, scaffold=scaffold, train_dir=train_dir, task=task,
      single_process=cluster is None, max_steps=FLAGS.max_steps,
      save_checkpoint_steps=FLAGS.save_checkpoint_steps,
      save_summaries_steps=FLAGS.save_summaries_steps,
      replicas=FLAGS.replicas_to_aggregate or len(task.worker_hosts),
      lost_worker_secs=FLAGS.lost_worker_secs,
      trace_steps=[int(s) for s in FLAGS.trace_steps])
  try:
    last_step = run_session(graph, session.SessionCreator(
        scaffold, master, config, task, train_dir, resume, shadows), hooks,
                            task_index, train_dir)
  except tf1.train.NanLossDuringTrainingError:
    print('Error: the model diverged with loss = NaN; the last good '
          'checkpoint in %s is kept. Lower --initial_learning_rate and '
          'restart.' % train_dir, file=sys.stderr)
    return 1
  finally:  # The step on the ps, or else the last this worker saw.
    final_step = None if cluster is None else (
        cluster_runtime.tell_cluster_done(
            master, config, task_index, task.ps_hosts, graph.global_step,
            bool(graph.sync_opt) and is_chief))
  return session.finished(task_index, final_step or last_step, FLAGS.max_steps)


def build_graph(task, cluster):
  """The input pipeline and the training graph of this worker."""
  sync = FLAGS.sync_replicas and cluster is not None
  replicas = FLAGS.replicas_to_aggregate or len(task.worker_hosts)
  input_device, variable_device = train_graph.devices(
      cluster=cluster, task_index=task.task_index, num_gpus=FLAGS.num_gpus)
  seed = FLAGS.seed + task.task_index
  tf1.set_random_seed(seed)
  with tf.device(input_device):
    images, labels = cifar10_input.generate_batch_inputs(
        eval_data=False, shuffle=True, data_dir=FLAGS.data_dir,
        batch_size=FLAGS.batch_size, seed=seed, distort=FLAGS.distort,
        num_preprocess_threads=FLAGS.num_preprocess_threads,
        standardize=FLAGS.standardize, crop_padding=FLAGS.crop_padding)
  with tf1.device(variable_device):
    return train_graph.build(
        images=images, labels=labels, num_ps=len(task.ps_hosts),
        is_chief=task.task_index == 0,
        schedule=schedule(FLAGS.batch_size * (replicas if sync else 1)),
        sync=(replicas, len(task.worker_hosts)) if sync else None,
        num_classes=data_layout.num_classes(FLAGS.data_dir)[0],
        loss_scale=(FLAGS.initial_loss_scale
                    if compute_dtype() == 'float16' else None),
        loss_scale_period=FLAGS.loss_scale_period,
        pack_transfers=FLAGS.pack_transfers and cluster is not None,
        transfer_dtype=tf.as_dtype(FLAGS.transfer_dtype))


def schedule(examples_per_update):
  """The learning rate's schedule, for updates of this many examples."""
  return learning_rate.Schedule(
      FLAGS.lr_schedule, FLAGS.initial_learning_rate, examples_per_update,
      FLAGS.lr_scaling, FLAGS.warmup_steps, FLAGS.max_steps,
      learning_rate.decay_steps(
          cifar10_input.num_records(FLAGS.data_dir, False),
          examples_per_update, FLAGS.num_epochs_per_decay),
      FLAGS.learning_rate_decay_factor)


def run_session(graph, creator, hooks, task_index, train_dir):
  """Creates the MonitoredSession, as the chief or a worker, and trains."""
  if task_index == 0:
    print('Worker 0: Initializing session...', flush=True)
  else:
    print('Worker %d: Waiting for session to be initialized...' % task_index,
          flush=True)
  with tf1.train.MonitoredSession(session_creator=creator,
                                  hooks=hooks) as sess:
    print('Worker %d: Session initialization complete.' % task_index,
          flush=True)
    writer = (tf1.summary.FileWriterCache.get(train_dir) if task_index == 0
              else None)
    return run_loop(sess, [graph.step_after, graph.loss, graph.accuracy],
                    writer, graph.global_step,
                    graph.schedule.examples_per_update)


def run_loop(sess, fetches, writer, global_step, examples_per_update):
  """Runs training steps until a hook stops the session; prints progress;
  returns the global step after this worker's last step (None: no step).

  Args:
    sess: The MonitoredSession.
    fetches: [global step after the train op, loss, accuracy]; running the
      first runs the train op.
    writer: The chief's summary writer, for examples/sec; None elsewhere.
    global_step: Its tensor: a run resumed at max_steps takes no step.
    examples_per_update: What one global step trains on, over all workers.
  """
  step = sess.run_step_fn(
      lambda step_context: step_context.session.run(global_step))
  if step >= FLAGS.max_steps:  # StopAtStepHook would let one step run.
    return step
  local_step, logged_step = 0, step
  start = time.time()
  left = session_hooks.TimeLeft(FLAGS.max_steps)
  while not sess.should_stop():
    step, loss_value, accuracy_value = session.run_step(sess, fetches)
    local_step += 1
    if local_step == 1:
      left.update(step)  # Where the global step's rate is measured from.
    if local_step % FLAGS.log_frequency == 0:
      duration = time.time() - start
      start = time.time()
      examples_per_sec = FLAGS.log_frequency * FLAGS.batch_size / duration
      print('%s: step %d, loss = %.2f ,Train accuracy = %.2f '
            '(%.1f examples/sec; %.3f sec/batch; %s left)' %
            (datetime.now(), step, loss_value, accuracy_value,
             examples_per_sec, duration / FLAGS.log_frequency,
             left.update(step)), flush=True)
      if writer:  # Its own rate, and the cluster's: how workers that come
        # and go change what the job trains on a second.
        cluster_per_sec = (step - logged_step) * examples_per_update / duration
        writer.add_summary(tf1.Summary(value=[
            tf1.Summary.Value(tag='examples/sec',
                              simple_value=examples_per_sec),
            tf1.Summary.Value(tag='cluster_examples/sec',
                              simple_value=cluster_per_sec)]), step)
      logged_step = step
    if step >= FLAGS.max_steps:
      # The step this run reached, read after it: in asynchronous training
      # StopAtStepHook's estimate (the step before the run, plus one) lags
      # behind the other workers' updates and lets a worker overshoot.
      break
  return step


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)
