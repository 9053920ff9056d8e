"""Distributed CIFAR-10 training with parameter servers, TF1 style.

A ClusterSpec of ps and worker tasks; variables spread over the ps tasks
through replica_device_setter, compute on each worker's device (one GPU per
worker task when --num_gpus > 0); SyncReplicasOptimizer aggregates the
workers' gradients. Worker 0 is the chief: it initializes or restores the
model, saves the checkpoints (each ps writes the shard of its variables) and
writes the summaries.

It reads top to bottom as mnist_replica.py does: the flags (train_flags.py),
the ClusterSpec, this task's Server, the graph (train_graph.py:
replica_device_setter, the model, SyncReplicasOptimizer), the
MonitoredSession and its loop. The machinery around them lives in the
training/ package (docs/code.md).

Three terminals, as in the reference (any start order):

  python train_distributed.py --job_name=ps --task_index=0
  python train_distributed.py --job_name=worker --task_index=1
  python train_distributed.py --job_name=worker --task_index=0

Every task stops by itself at --max_steps (each ps once every worker said it
is done). With --ps_hosts= (empty) one worker trains, without a gRPC server.
"""

import collections
from datetime import datetime
import os
import signal
import sys
import time

from training.runtime import process

if __name__ == '__main__':
  process.start()  # Before TensorFlow loads: see training/runtime/process.py.

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
import tensorflow as tf

import cifar10_eval
import cifar10_input
import cifar10_model
import train_flags
import train_graph
from training.cluster import cluster_config
from training.cluster import session_config
from training.graph import learning_rate
from training.graph import precision
from training.health import liveness
from training.health import run_end
from training.runtime import progress
from training.runtime import versions
from training.session import chief_start
from training.session import creator
from training.session import hook_order
from training.session.hooks import StopOnSignalHook, events_writer
from training.storage import checkpoints
from training.storage import data_layout

tf1 = tf.compat.v1

FLAGS = flags.FLAGS
flags.adopt_module_key_flags(train_flags)  # --help lists them as ours.


def main(_):
  tf1.disable_eager_execution()  # Queue runners need graph mode.
  # TensorFlow's Python log: errors (the TF1 API we keep warns at every
  # start), and the INFO note of a lost task, which ReportLostTask shortens.
  tf.get_logger().setLevel('INFO')
  try:
    task = check_flags()
    tf.get_logger().addFilter(liveness.ReportLostTask(task.task_index))
    print('job_name : %s' % task.job_name)
    print('task_index : %d' % task.task_index)
    versions.warn_if_untested(tf.__version__)  # One line; it may work.
    cluster = (tf.train.ClusterSpec({'ps': task.ps_hosts,
                                     'worker': task.worker_hosts})
               if task.ps_hosts else None)  # None: one process, no server.
    if task.job_name == 'ps':
      signal.signal(signal.SIGINT, signal.SIG_DFL)  # Nothing to save: go.
      config = session_config.session_config(
          'ps', task.task_index, task.worker_hosts, ps_hosts=task.ps_hosts)
      server = start_server(cluster, 'ps', task.task_index, config)
      # The reference's server.join(), which never returned.
      status = run_end.serve(server, cluster=cluster,
                             task_index=task.task_index, config=config)
    elif task.job_name == 'evaluator':
      StopOnSignalHook('Evaluator')
      status = cifar10_eval.run(
          FLAGS.train_dir, FLAGS.data_dir, FLAGS.batch_size,
          FLAGS.standardize, FLAGS.max_steps, FLAGS.eval_interval_secs,
          FLAGS.run_once, flips=FLAGS.eval_flips)
    else:
      status = train_worker(task, cluster)
  except (cluster_config.UsageError, cifar10_input.DataError,
          checkpoints.TrainDirError, checkpoints.WriteError) as e:
    print('Error: %s' % e, file=sys.stderr)
    status = 2  # (3, a ps lost at the last save: CheckpointSaverHook.)
  # All is written (the summary hook flushed; a ps waited for the workers
  # to exit): skip Python's 1.4-1.6 s teardown of TensorFlow.
  process.exit_now(status)


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
    session_config.check_devices(FLAGS.num_gpus)
  liveness.configure(lost_secs=FLAGS.lost_worker_secs,
                     report_secs=FLAGS.wait_report_secs)
  return task


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


def compute_dtype():
  """What the worker computes in: None (float32), bfloat16 or float16."""
  return precision.compute_dtype(
      FLAGS.mixed_precision, FLAGS.mixed_precision_dtype, FLAGS.num_gpus)


def start_server(cluster, job_name, task_index, config):
  """Starts this task's gRPC server, or says in one line why it cannot."""
  try:
    return tf1.train.Server(cluster, job_name=job_name, task_index=task_index,
                            config=config)
  except (tf.errors.OpError, ValueError) as e:
    raise cluster_config.UsageError(
        'could not start the %s %d server on %s (is the port taken?): %s' % (
            job_name, task_index, cluster.task_address(job_name, task_index),
            str(e).splitlines()[0]))


def train_worker(task, cluster):
  """Trains as worker task.task_index; returns the exit status."""
  index, is_chief = task.task_index, task.task_index == 0
  train_dir = os.path.abspath(FLAGS.train_dir)  # The ps tasks write there.
  config = session_config.session_config(
      'worker', index, task.worker_hosts if cluster else None,
      FLAGS.num_gpus, FLAGS.intra_op_threads, FLAGS.log_device_placement,
      compute_dtype())
  if cluster is None:
    master = ''  # One process: no server.
  elif FLAGS.existing_servers:
    master = 'grpc://' + task.worker_hosts[index]
    print('Using existing server at: %s' % master)
  else:
    master = start_server(cluster, 'worker', index, config).target
  sync = FLAGS.sync_replicas and cluster is not None
  replicas = FLAGS.replicas_to_aggregate or len(task.worker_hosts)
  gradients = replicas if sync else 1  # What an update aggregates.
  input_device, variable_device = train_graph.devices(
      cluster=cluster, task_index=index, num_gpus=FLAGS.num_gpus)
  with tf.device(input_device):
    images, labels = inputs(seed=FLAGS.seed + index)
  with tf1.device(variable_device):
    graph = train_graph.build(
        images=images, labels=labels, num_ps=len(task.ps_hosts), worker=index,
        schedule=schedule(FLAGS.batch_size * gradients),
        sync=(replicas, len(task.worker_hosts)) if sync else None,
        rule=train_graph.UpdateRule(FLAGS.optimizer, FLAGS.momentum,
                                    FLAGS.nesterov),
        terms=train_graph.LossTerms(FLAGS.weight_decay, FLAGS.label_smoothing),
        num_classes=data_layout.num_classes(FLAGS.data_dir)[0],
        batch_norm_decay=batch_norm_decay(gradients=gradients, chief=is_chief),
        loss_scale=(FLAGS.initial_loss_scale
                    if compute_dtype() == 'float16' else None),
        loss_scale_period=FLAGS.loss_scale_period,
        pack_transfers=FLAGS.pack_transfers and cluster is not None,
        transfer_dtype=tf.as_dtype(FLAGS.transfer_dtype))
  creator, hooks = session_parts(task, cluster, graph, master, config,
                                 train_dir)
  print('Worker 0: Initializing session...' if is_chief else
        'Worker %d: Waiting for session to be initialized...' % index,
        flush=True)
  last_step = None
  try:
    with tf1.train.MonitoredSession(session_creator=creator,
                                    hooks=hooks) as sess:
      print('Worker %d: Session initialization complete.' % index, flush=True)
      last_step = run_loop(sess, graph, is_chief=is_chief,
                           train_dir=train_dir)
  except tf1.train.NanLossDuringTrainingError:
    print('Error: the model diverged with loss = NaN; the last good '
          'checkpoint in %s is kept. Lower --initial_learning_rate and '
          'restart.' % train_dir, file=sys.stderr)
    return 1
  finally:  # The step on the ps, or else the last this worker saw.
    final_step = None if cluster is None else run_end.tell_cluster_done(
        master=master, config=config, task_index=index,
        ps_hosts=task.ps_hosts, global_step=graph.global_step,
        close=sync and is_chief)
  return finished(index, final_step or last_step)


def inputs(*, seed):
  """A training batch from the 16-thread shuffle_batch queue."""
  tf1.set_random_seed(seed)
  return cifar10_input.generate_batch_inputs(
      eval_data=False, shuffle=True, data_dir=FLAGS.data_dir,
      batch_size=FLAGS.batch_size, seed=seed, distort=FLAGS.distort,
      num_preprocess_threads=FLAGS.num_preprocess_threads,
      standardize=FLAGS.standardize, crop_padding=FLAGS.crop_padding,
      erasing=FLAGS.random_erasing, erasing_fill=FLAGS.erasing_fill)


def batch_norm_decay(*, gradients, chief):
  """BatchNorm's decay for updates of this many gradients; the chief says
  which where an update aggregates several."""
  decay = cifar10_model.batch_norm_decay(FLAGS.batch_norm_decay, gradients)
  if chief and gradients > 1:
    print('Worker 0: BatchNorm\'s moving statistics keep %.4g an update (%s)'
          % (decay, '--batch_norm_decay' if FLAGS.batch_norm_decay is not None
             else '%g^%d: %d gradients an update; --batch_norm_decay sets '
             'another' % (cifar10_model.BATCH_NORM_DECAY, gradients,
                          gradients)), flush=True)
  return decay


def schedule(examples_per_update):
  """The learning rate's schedule, for updates of this many examples."""
  return learning_rate.Schedule(
      FLAGS.lr_schedule, FLAGS.initial_learning_rate, examples_per_update,
      FLAGS.lr_scaling, FLAGS.warmup_steps, FLAGS.max_steps,
      learning_rate.decay_steps(
          cifar10_input.num_records(FLAGS.data_dir, False),
          examples_per_update, FLAGS.num_epochs_per_decay),
      FLAGS.learning_rate_decay_factor)


def session_parts(task, cluster, graph, master, config, train_dir):
  """What the MonitoredSession is made of: (its creator, its hooks).

  The chief first says what it trains with and resumes from; only now, with
  the data checked and the port ours, is train_dir touched: a mistake on
  the command line must not cost a --fresh_start deletion.
  """
  is_chief = task.task_index == 0
  line = (precision.mixed_precision_line(
      task.task_index, compute_dtype(), FLAGS.num_gpus) if compute_dtype()
          else precision.mixed_precision_hint(task.task_index, FLAGS.num_gpus))
  if line:  # Without the flag, a line only where it would pay.
    print(line)
  checkpoints.prepare(train_dir, is_chief, FLAGS.fresh_start)
  shadows = cifar10_model.averages_of_weights()
  resume = (chief_start.chief_start(
      train_dir, data_layout.identity(FLAGS.data_dir), FLAGS.new_data,
      FLAGS.max_steps, len(task.ps_hosts), graph.schedule, shadows,
      standardize=FLAGS.standardize) if is_chief else None)
  scaffold = train_graph.scaffold(graph)
  hooks = hook_order.in_order(
      graph=graph, scaffold=scaffold, train_dir=train_dir, task=task,
      single_process=cluster is None, max_steps=FLAGS.max_steps,
      save_checkpoint_steps=FLAGS.save_checkpoint_steps,
      save_summaries_steps=FLAGS.save_summaries_steps,
      replicas=FLAGS.replicas_to_aggregate or len(task.worker_hosts),
      trace_steps=[int(s) for s in FLAGS.trace_steps],
      set_aside=FLAGS.set_aside)
  return creator.SessionCreator(scaffold, master, config, task, train_dir,
                                resume, shadows), hooks


def run_loop(sess, graph, *, is_chief, train_dir):
  """Runs training steps until a hook stops the session; prints progress;
  returns the global step after this worker's last step (None: no step).

  The chief also writes its examples/sec and the cluster's to TensorBoard:
  how workers that come and go change what the job trains on a second.
  """
  step = sess.run_step_fn(
      lambda step_context: step_context.session.run(graph.global_step))
  if step >= FLAGS.max_steps:  # StopAtStepHook would let one step run.
    return step
  writer = events_writer(train_dir) if is_chief else None
  local_step, logged_step = 0, step
  start = time.time()
  left = TimeLeft(FLAGS.max_steps)
  while not sess.should_stop():
    step, loss_value, accuracy_value = creator.run_step(
        sess, [graph.step_after, graph.loss, graph.accuracy])
    local_step += 1
    if local_step == 1:
      left.update(step)  # Where the global step's rate is measured from.
    if local_step % FLAGS.log_frequency == 0:
      duration, start = time.time() - start, time.time()
      examples_per_sec = FLAGS.log_frequency * FLAGS.batch_size / duration
      print(progress.format_line(
          time=datetime.now(), step=step, loss=loss_value,
          accuracy=accuracy_value, examples_per_sec=examples_per_sec,
          sec_per_batch=duration / FLAGS.log_frequency,
          left=left.update(step)), flush=True)
      if writer:
        writer.add_summary(tf1.Summary(value=[
            tf1.Summary.Value(tag='examples/sec',
                              simple_value=examples_per_sec),
            tf1.Summary.Value(
                tag='cluster_examples/sec', simple_value=(
                    (step - logged_step) *
                    graph.schedule.examples_per_update / duration))]), step)
      logged_step = step
    if step >= FLAGS.max_steps:
      # The step this run reached, read after it: in asynchronous training
      # StopAtStepHook's estimate (the step before the run, plus one) lags
      # behind the other workers' updates and lets a worker overshoot.
      break
  return step


class TimeLeft:
  """The time left to max_steps, at the recent rate of the global step.

  The global step counts every worker's updates, so the chief's estimate is
  the cluster's. Recent: the first steps are slower, and a worker that
  joins or leaves changes the rate.
  """

  WINDOW = 5  # Progress lines the rate is measured over.

  def __init__(self, max_steps, clock=time.time):
    """Args: clock: returns the time in seconds (a test's own clock)."""
    self._max_steps = max_steps
    self._clock = clock
    self._points = collections.deque(maxlen=self.WINDOW + 1)

  def update(self, step):
    """Records the global step reached now; returns the time left, H:MM:SS
    ('?' before the step has moved)."""
    self._points.append((self._clock(), step))
    (then, first), (now, last) = self._points[0], self._points[-1]
    if last <= first or now <= then:
      return '?'
    secs = round(max(0, self._max_steps - last) * (now - then) /
                 (last - first))
    return '%d:%02d:%02d' % (secs // 3600, secs // 60 % 60, secs % 60)


def finished(task_index, step):
  """Says where this worker's training ended; returns the exit status: 0
  at max_steps, 1 before it or when the step is not known."""
  if step is None:
    return 1
  print('Worker %d: training finished at global step %d' % (task_index,
                                                            step),
        flush=True)
  return 0 if step >= FLAGS.max_steps else 1


if __name__ == '__main__':
  app.run(main, flags_parser=train_flags.parse_flags)
