"""The session machinery of a worker: creating, recovering and stopping it.

MonitoredSession and SyncReplicasOptimizer as TF1 meant them, with what the
stock pieces get wrong at start, at a lost task and at the end:
SyncReplicasHook starts and stops the chief's sync thread cleanly;
SessionCreator polls for the chief every 0.5 s instead of 30 s, restores the
newest checkpoint that can be read, says what it waits for and when the
cluster comes back; CheckpointSaver says in one line why a save failed;
JoinedWorkers names the workers a synchronous chief goes on without;
ReportLostTask turns TensorFlow's INFO note about a lost task into one line;
run_step recovers from a lost task that TensorFlow reports as a cancelled
step; TimeLeft estimates the time to --max_steps; TraceSteps writes Chrome
traces of chosen steps, with the bytes they moved;
StopOnSignal makes SIGINT/SIGTERM checkpoint (on the chief) and exit even
while a step is blocked; LearningRateLine says the chief's learning rate.
"""

import collections
import logging
import os
import re
import signal
import sys
import threading
import time

import tensorflow as tf
from tensorflow.python.client import timeline

from training import checkpoints
from training import cluster_runtime
from training import learning_rate
from training import placement
from training import log_filter

tf1 = tf.compat.v1

# How often a worker that waits for the chief to initialize the model looks
# again. The stock session creators poll every 30 s, which a synchronous
# chief then spends waiting for that worker's first gradients.
RECOVERY_WAIT_SECS = 0.5


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

  def __init__(self, task_index):
    super().__init__()
    self._task_index = task_index

  def filter(self, record):
    if record.levelno >= logging.ERROR:
      return True
    message = record.getMessage()
    if message.startswith(self.PREFIX):
      print('Worker %d: lost a task of the cluster (%s); waiting for it to '
            'come back' % (self._task_index, checkpoints.first_line(
                message.split(' Error: ', 1)[-1])), file=sys.stderr,
            flush=True)
    return False


def run_step(sess, fetches):
  """Runs one training step in the MonitoredSession; returns the fetches.

  MonitoredSession recovers (closes the broken session, waits for the cluster,
  creates a new one) when a step raises AbortedError or UnavailableError. A
  step spans several tasks, and when a ps dies during it the error raised is
  the status of whichever part of the step reported first; that can be
  CancelledError. Measured in tests/test_faults.py: with ps 1 killed, worker
  1 died of "CANCELLED: From /job:ps/replica:0/task:0: RecvFromRemoteAsync is
  cancelled", with "ABORTED: ... Session handle is not found" after it.
  Nothing in this program cancels a training step (a signal exits the
  process), so a cancelled step is a lost task: it is raised again as
  AbortedError inside run_step_fn, where MonitoredSession's recovery sees it.
  """
  def step_fn(step_context):
    try:
      return step_context.run_with_hooks(fetches)
    except tf.errors.CancelledError as e:
      raise tf.errors.AbortedError(e.node_def, e.op, e.message) from e

  return sess.run_step_fn(step_fn)


class SkippedSteps(tf1.train.SessionRunHook):
  """The chief's line when float16's loss scaling skipped more steps.

  A step whose float16 gradients overflowed leaves the weights as they were
  (see precision.LossScaled); a few at the start, while the scale
  finds its level, are expected, and many say the model's numbers do not
  fit float16. Said after a step only when the count grew.
  """

  def __init__(self, reads):
    """Args: reads: [skipped steps, scale], read after the train op
    (LossScaled.reads_after)."""
    self.reads = reads
    self.said = 0

  def before_run(self, run_context):
    return tf1.train.SessionRunArgs(self.reads)

  def after_run(self, run_context, run_values):
    skipped, scale = run_values.results
    if skipped > self.said:
      self.said = skipped
      say_as_chief('%d steps so far had float16 gradients that overflowed; '
                   'they left the weights as they were, and the loss scale '
                   'is now %g' % (skipped, scale))


class LearningRateLine(tf1.train.SessionRunHook):
  """The chief's line about its learning rate: the schedule, and the rate
  at the global step it starts (or resumes, or recovers) from."""

  def __init__(self, graph):
    """Args: graph: The TrainingGraph."""
    self.graph = graph
    self.reads = None

  def begin(self):
    # The rate of the step read, from that one read: the other workers may
    # move the global step between two.
    step = self.graph.global_step.read_value()
    self.reads = [step, learning_rate.rate(self.graph.schedule, step)]

  def after_create_session(self, session, coord):
    step, rate = session.run(self.reads)
    print('Worker 0: learning rate: %s; %.4g at global step %d' % (
        learning_rate.describe(self.graph.schedule), rate, step), flush=True)


def chief_start(train_dir, data, new_data, max_steps, num_ps, schedule,
                shadows):
  """What the chief says and checks before its session: the data it trains
  on (checkpoints.check_data_record), what it resumes, a schedule of the
  learning rate that changed, a run already at max_steps, and what each ps
  holds.

  Args:
    train_dir: --train_dir, made.
    data: data_layout.identity() of --data_dir.
    new_data: --new_data.
    max_steps: --max_steps.
    num_ps: The ps tasks.
    schedule: The learning_rate.Schedule of this run.
    shadows: {moving average: its weight}: the averages a checkpoint of an
      earlier release may lack and that start from their weights.

  Returns:
    The checkpoints.Resume to resume from, or None.
  """
  resume = checkpoints.resume_point(train_dir, tf1.global_variables(),
                                    say_as_chief, shadows.__contains__)
  checkpoints.check_data_record(train_dir, data, resume, new_data,
                                say_as_chief)
  checkpoints.check_schedule_record(train_dir, schedule, resume,
                                    say_as_chief)
  if resume and resume.step >= max_steps:
    say_as_chief('%s is at global step %d, at or past --max_steps=%d: '
                 'nothing to train, it stops at once (raise --max_steps to '
                 'train on, or --fresh_start to start over)' % (
                     resume.path, resume.step, max_steps))
  for line in placement.describe_loads(tf1.global_variables(), num_ps):
    say_as_chief(line)
  return resume


def say_as_chief(line):
  """Prints one of the chief's notes about its checkpoints."""
  print('Worker 0: %s' % line, file=sys.stderr, flush=True)


class SessionCreator(tf1.train.SessionCreator):
  """ChiefSessionCreator / WorkerSessionCreator with a short recovery wait,
  the newest readable checkpoint, the model the ps tasks still hold, and a
  word on what it waits for.

  The stock creators build a SessionManager that polls every 30 s: a worker
  started before the chief has initialized the model sleeps 30 s before it
  looks again, and a synchronous chief's first step waits for it. They
  restore the latest checkpoint even when its files are damaged, and wait
  for a ps that was never started without a word. And a chief that comes
  back restores its last checkpoint over the model the ps tasks hold, newer
  by every step trained since (a lost chief's asynchronous workers went on
  for minutes): here it keeps that model.
  """

  def __init__(self, scaffold, master, config, task, train_dir, resume,
               shadows):
    """Made before the graph is finalized. Args: task: this
    cluster_config.Task; resume: the chief's checkpoints.Resume, or
    None; shadows: see chief_start."""
    self._scaffold = scaffold
    self._master = master
    self._config = config
    self._task = task
    self._name = 'Worker %d' % task.task_index
    self._is_chief = task.task_index == 0
    self._train_dir = train_dir
    self._resume = resume
    # What an earlier release's checkpoint lacks, made while it can be.
    self._shadows = shadows
    self._rebuild = (checkpoints.Rebuild(resume.missing, shadows)
                     if resume and resume.missing else None)
    self._sessions = 0

  def create_session(self):
    # MonitoredSession calls this again once a lost task is back (see
    # ReportLostTask): a restarted ps has lost its variables.
    if self._sessions:
      print('%s: the cluster is back; %s' % (
          self._name, 'restoring the latest checkpoint unless the ps tasks '
          'still hold the model' if self._is_chief else
          'waiting for the chief to restore the model'),
            file=sys.stderr, flush=True)
      if self._is_chief:
        self._resume = checkpoints.resume_point(
            self._train_dir, tf1.global_variables(), say_as_chief,
            self._shadows.__contains__)
    self._sessions += 1
    self._scaffold.finalize()
    manager = tf1.train.SessionManager(
        local_init_op=self._scaffold.local_init_op,
        ready_op=self._scaffold.ready_op,
        ready_for_local_init_op=self._scaffold.ready_for_local_init_op,
        graph=tf1.get_default_graph(),
        recovery_wait_secs=RECOVERY_WAIT_SECS)
    with cluster_runtime.WaitReporter(self._waiting_for):
      if not self._is_chief:
        return manager.wait_for_session(self._master, config=self._config)
      return manager.prepare_session(self._master, config=self._config,
                                     init_fn=self._init_model)

  def _init_model(self, session):
    """The chief's init: keeps the model the ps tasks hold if it is at or
    past the checkpoint, else restores the checkpoint, else initializes."""
    resume = self._resume
    if resume is None:
      session.run(self._scaffold.init_op)
      return
    if not self._model_on_ps(session, resume):
      self._restore(session, resume)
    # Each start learns the checkpoints already there (a Saver knows only
    # those it wrote), so that max_to_keep holds across restarts.
    self._scaffold.saver.recover_last_checkpoints(resume.older +
                                                  [resume.path])

  def _model_on_ps(self, session, resume):
    """Whether the ps tasks hold every variable, at or past the checkpoint's
    global step: the chief alone was lost, and the steps since its last
    checkpoint are there. Says so when they do."""
    if len(session.run(self._scaffold.ready_for_local_init_op)):
      return False  # A new or restarted ps: nothing, or only part.
    on_ps = session.run(tf1.train.get_global_step())
    if on_ps < resume.step:
      return False  # Not this run's (a ps left over from an older one).
    say_as_chief('the ps tasks hold the model at global step %d, at or past '
                 'the last checkpoint (%s): going on from there, not from '
                 'the checkpoint' % (on_ps, os.path.basename(resume.path)))
    return True

  def _restore(self, session, resume):
    """Restores resume's checkpoint; the averages it lacks from its
    weights."""
    if not resume.missing:
      self._scaffold.saver.restore(session, resume.path)
    elif self._rebuild and set(resume.missing) == self._rebuild.missing:
      session.run(self._scaffold.init_op)
      self._rebuild.saver.restore(session, resume.path)
      session.run(self._rebuild.init_missing)
      say_as_chief('%s has no moving averages of the weights (an earlier '
                   'release wrote it): resuming from it, the %d averages '
                   'starting from its weights' % (resume.path, len({
                       checkpoints.saved_name_and_shape(v)[0]
                       for v in resume.missing})))
    else:  # Checked at start: only a checkpoint written since could be.
      raise checkpoints.TrainDirError(
          '%s lacks variables this run did not prepare to rebuild: restart '
          'the chief to resume from it' % resume.path)
    if self._sessions > 1:  # Where the cluster starts again from.
      say_as_chief('restored the model at global step %d' % resume.step)
    else:
      print('Worker 0: resuming from %s' % resume.path, flush=True)

  def _waiting_for(self):
    """The line to print while the session is not there yet, or None."""
    if not self._task.ps_hosts:
      return None
    missing = cluster_runtime.unreachable(self._task.ps_hosts)
    if missing:
      return '%s: waiting for %s; start %s, or check --ps_hosts' % (
          self._name, cluster_runtime.name_ps(missing),
          'it' if len(missing) == 1 else 'them')
    if not self._is_chief:
      return ('%s: waiting for the chief, worker 0 at %s, to initialize or '
              'restore the model' % (self._name, self._task.worker_hosts[0]))
    return None


class CheckpointSaver(tf1.train.CheckpointSaverHook):
  """TensorFlow's CheckpointSaverHook, saying in one line why a save failed,
  and keeping max_to_keep checkpoints across restarts.

  A save that fails (disk full, read-only, quota; in a cluster the ps tasks
  write the shards, and their error comes back the same way) raises
  checkpoints.WriteError, after its temporary files are removed, instead
  of a TensorFlow error inside two chained tracebacks. A save that fails
  because a ps was lost is a lost task, from which MonitoredSession
  recovers. At the end, when there is no recovery, the chief says so in
  one line naming the ps and exits 3 at once: closing the session would
  wait for the lost ps forever (measured: TF_CloseSession blocks), and the
  run is not done, so the ps tasks still there are not told it is; they
  wait for the restarted chief, which resumes from the last checkpoint.
  """

  def __init__(self, train_dir, save_steps, scaffold, ps_hosts):
    super().__init__(train_dir, save_steps=save_steps, scaffold=scaffold)
    self._train_dir = train_dir
    self._ps_hosts = ps_hosts
    self._ending = False

  def after_create_session(self, session, coord):
    try:
      super().after_create_session(session, coord)  # Saves graph.pbtxt too.
    except cluster_runtime.LOST_TASK_ERRORS:
      raise  # MonitoredSession creates the session again once it is back.
    except tf.errors.OpError as e:
      raise checkpoints.write_failure(
          self._train_dir, session.run(self._global_step_tensor), e) from e

  def end(self, session):
    self._ending = True
    try:
      super().end(session)  # Reads the global step, then saves.
      return
    except cluster_runtime.LOST_TASK_ERRORS as e:  # Before the save.
      error = checkpoints.write_failure(
          self._train_dir, None, e, cluster_runtime.lost_ps(self._ps_hosts) or
          checkpoints.first_line(e))
    except checkpoints.LostPsError as e:  # The save's (_save).
      error = e
    print('Error: %s' % error, file=sys.stderr, flush=True)
    exit_now(3)

  def _save(self, session, step):
    # TensorFlow's _save, with the checkpoint named after the step it holds.
    try:
      checkpoints.save(self._get_saver(), session, self._train_dir, step,
                       write_meta_graph=self._save_graph_def)
    except cluster_runtime.LOST_TASK_ERRORS as e:
      if not self._ending:
        raise  # A lost ps: MonitoredSession waits for it and recovers.
      raise checkpoints.write_failure(
          self._train_dir, step, e, cluster_runtime.lost_ps(self._ps_hosts) or
          checkpoints.first_line(e)) from e
    except tf.errors.OpError as e:
      raise checkpoints.write_failure(self._train_dir, step, e) from e
    self._summary_writer.add_session_log(tf1.SessionLog(
        status=tf1.SessionLog.CHECKPOINT, checkpoint_path=self._save_path),
                                         step)
    checkpoints.keep_newest(self._get_saver(), self._train_dir)
    return False  # No listeners, so none asks to stop.


class JoinedWorkers(tf1.train.SessionRunHook):
  """Each worker says on ps 0 that it has joined; the chief of a synchronous
  run names the listed workers that have not.

  Without a word, a synchronous chief whose fellow workers never came takes
  their tokens too and trains alone: two of its steps per global step with
  two workers listed, and nothing says why it is slow.
  """

  def __init__(self, task_index, worker_hosts, replicas):
    self._task_index = task_index
    self._worker_hosts = worker_hosts
    self._replicas = replicas
    queues = cluster_runtime.join_queues(len(worker_hosts))
    self._sizes = [q.size() for q in queues]
    self._post = queues[task_index].enqueue(task_index)

  def after_create_session(self, session, coord):
    # Once: a restarted worker has joined already (and its queue holds one
    # slot). Only this worker writes to its queue, so there is no race.
    if not session.run(self._sizes[self._task_index]):
      session.run(self._post)
    if self._task_index == 0:
      threading.Thread(target=self._watch, args=(session,), daemon=True,
                       name='joined_workers').start()

  def _missing(self, session):
    return [i for i, size in enumerate(session.run(self._sizes)) if not size]

  def _watch(self, session):
    """Looks every second; names the missing after WAIT_REPORT_SECS, then
    every WAIT_REPEAT_SECS, and says when they are all there."""
    next_report, reported = cluster_runtime.WAIT_REPORT_SECS, False
    start = time.time()
    try:
      while True:
        time.sleep(1)
        missing = self._missing(session)
        if not missing:
          break
        if time.time() - start >= next_report:
          print('Worker 0: waiting for %s to join; meanwhile the workers '
                'that have joined compute its share of the %d gradients per '
                'step' % (cluster_runtime.workers_named(
                    missing, self._worker_hosts), self._replicas), flush=True)
          next_report += cluster_runtime.WAIT_REPEAT_SECS
          reported = True
    except (tf.errors.OpError, RuntimeError):
      return  # The session ended, or a ps was lost: a new one starts over.
    if reported:
      print('Worker 0: all %d workers have joined' % len(self._worker_hosts),
            flush=True)


class ChiefWatch(tf1.train.SessionRunHook):
  """A worker's watch on the chief: says when it is lost and when it is
  back, and pauses this worker meanwhile.

  Only the chief writes checkpoints and, in synchronous training, runs the
  updates; a lost chief stopped a synchronous cluster without a word, and
  let asynchronous workers train on unsaved (measured: 1,280 steps in
  40 s, then restored over by the returning chief). Now the chief that
  comes back keeps the model the ps tasks hold (SessionCreator), and the
  workers wait for it, in both modes alike: the steps at risk are the few
  made before the loss is seen, not an unbounded number that no one saves.
  The chief's server takes connections as long as it runs, so a refused
  or timed-out connection for GONE_SECS is a lost chief; with the global
  step at max_steps it is a chief that finished.
  """

  POLL_SECS = 2
  GONE_SECS = 6

  def __init__(self, task_index, chief_host, global_step, max_steps):
    self._name = 'Worker %d' % task_index
    self._chief_host = chief_host
    self._global_step = global_step
    self._max_steps = max_steps
    self._session = None
    self._present = threading.Event()
    self._present.set()

  def after_create_session(self, session, coord):
    if self._session is None:
      threading.Thread(target=self._watch, daemon=True,
                       name='chief_watch').start()
    self._session = session  # A new one after a lost ps.

  def before_run(self, run_context):
    self._present.wait()

  def _finished(self):
    """Whether training is over (the chief ends before the others)."""
    try:
      return self._session.run(self._global_step, options=tf1.RunOptions(
          timeout_in_ms=10000)) >= self._max_steps
    except (tf.errors.OpError, RuntimeError):
      return False  # A ps lost too: that is said on its own.

  def _watch(self):
    lost_since = None
    while True:
      time.sleep(self.POLL_SECS)
      lost = cluster_runtime.unreachable([self._chief_host])
      if not lost:
        lost_since = None
        if not self._present.is_set():
          print('%s: the chief, worker 0 at %s, is back; going on' % (
              self._name, self._chief_host), flush=True)
          self._present.set()
        continue
      lost_since = lost_since or time.time()
      if (self._present.is_set() and
          time.time() - lost_since >= self.GONE_SECS):
        if self._finished():
          return
        self._present.clear()
        print('%s: lost the chief, worker 0 at %s (%s); no checkpoint is '
              'written until it is back, and the steps since its last one '
              'are only on the ps tasks, which keep them: start it again '
              'and it goes on from there. This worker waits for it' % (
                  self._name, self._chief_host, lost[0][2]), flush=True)


class TimeLeft:
  """The time left to max_steps, at the recent rate of the global step.

  The global step, not this worker's steps: in a cluster it counts the
  updates of all workers, so the chief's estimate is the cluster's. Recent:
  the first steps (start-up, a cold input queue) are slower, and a worker
  that joins or leaves changes the rate.
  """

  WINDOW = 5  # Progress lines the rate is measured over.

  def __init__(self, max_steps):
    self._max_steps = max_steps
    self._points = collections.deque(maxlen=self.WINDOW + 1)

  def update(self, step):
    """Records the global step reached now; returns the time left, H:MM:SS
    ('?' before the step has moved)."""
    self._points.append((time.time(), step))
    (then, first), (now, last) = self._points[0], self._points[-1]
    if last <= first or now <= then:
      return '?'
    secs = round(max(0, self._max_steps - last) * (now - then) /
                 (last - first))
    return '%d:%02d:%02d' % (secs // 3600, secs // 60 % 60, secs % 60)


class TraceSteps(tf1.train.SessionRunHook):
  """Writes a Chrome trace of some of this worker's steps into train_dir.

  The step runs with FULL_TRACE, so the trace has every op of it on every
  device it touched: this worker's compute, the ps tasks' reads of the
  variables and applies of the gradients, the transfers between them, and
  waiting for the synchronous token. TensorFlow's ProfilerHook traces every
  N global steps; this traces the worker's own step numbers, so each worker
  writes one file for each, whichever worker ran which global step.
  """

  def __init__(self, steps, train_dir, task_index):
    """Args: steps: local step numbers, from 1; task_index: this worker's."""
    self._steps = set(steps)
    self._train_dir = train_dir
    self._task_index = task_index
    self._local_step = 0

  def before_run(self, run_context):
    self._local_step += 1
    if self._local_step in self._steps:
      return tf1.train.SessionRunArgs(None, options=tf1.RunOptions(
          trace_level=tf1.RunOptions.FULL_TRACE))
    return None

  def after_run(self, run_context, run_values):
    if self._local_step not in self._steps:
      return
    trace = timeline.Timeline(run_values.run_metadata.step_stats)
    path = os.path.join(self._train_dir, 'trace_worker%d_step%d.json' % (
        self._task_index, self._local_step))
    with open(path, 'w') as f:
      f.write(trace.generate_chrome_trace_format())
    pulled, pushed = transfer_bytes(run_values.run_metadata.step_stats,
                                    '/job:worker/replica:0/task:%d/' %
                                    self._task_index)
    print('Worker %d: wrote the trace of its step %d to %s; the step pulled '
          '%d bytes from the ps tasks and pushed %d' % (
              self._task_index, self._local_step, path, pulled, pushed),
          flush=True)


# The label of a transfer in a step's stats: `[18432B] [248.2Mb/s]
# edge_77_Cast_4 from /job:ps/replica:0/task:0/device:CPU:0 to /job:...`
# (its size rounded, `[0.3MB]`, for large ones: the exact size is the
# RecvTensor's output allocation).
TRANSFER = re.compile(r'^\[[\d.]+[KMG]?B\] .* from (\S+) to (\S+)$')


def transfer_bytes(step_stats, worker):
  """(bytes from the ps tasks to worker, bytes from worker to them) in a
  traced step, from its RecvTensor records (the ps side's only when a ps
  sent its stats back in time)."""
  pulled = pushed = 0
  for device in step_stats.dev_stats:
    for node in device.node_stats:
      match = TRANSFER.match(node.timeline_label)
      if node.node_name != 'RecvTensor' or not match:
        continue
      size = sum(o.tensor_description.allocation_description.requested_bytes
                 for o in node.output)
      source, dest = match.groups()
      if source.startswith('/job:ps/') and dest.startswith(worker):
        pulled += size
      elif source.startswith(worker) and dest.startswith('/job:ps/'):
        pushed += size
  return pulled, pushed


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
  between the read of the global step and the save: the checkpoint is a
  snapshot, named after the step it holds (checkpoints.save). A second
  signal exits at once, without waiting for the save.
  """

  # How long a single process waits for its step in flight before it saves
  # anyway: a step that raised never reports its end.
  STEP_WAIT_SECS = 30

  def __init__(self, name, scaffold=None, train_dir=None, global_step=None,
               wait_for_step=False, ps_hosts=()):
    """Starts watching for the signals.

    Args:
      name: This task, for the message: 'Worker 0', 'Evaluator'.
      scaffold: The chief's Scaffold, whose saver writes the checkpoint;
        None on other workers, which only exit.
      train_dir: Where the checkpoint goes.
      global_step: The global step tensor, which names the checkpoint.
      wait_for_step: Whether to let the step in flight finish first; only
        where nothing else changes the variables (a single process).
      ps_hosts: The ps tasks that write the checkpoint's shards, named when
        one is lost.
    """
    self._name = name
    self._scaffold, self._train_dir = scaffold, train_dir
    self._global_step = global_step
    self._ps_hosts = ps_hosts
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
    threading.Thread(target=self._exit_now, args=(read_fd,), daemon=True,
                     name='second_signal').start()
    message = '%s: %s' % (self._name, signal.Signals(signum).name)
    if self._scaffold is not None and self._session is not None:
      if self._wait_for_step:
        with self._step_state:
          self._stopping = True
          self._step_state.wait_for(lambda: not self._in_step,
                                    timeout=self.STEP_WAIT_SECS)
      try:
        path = checkpoints.save(
            self._scaffold.saver, self._session, self._train_dir,
            self._session.run(self._global_step))
        checkpoints.keep_newest(self._scaffold.saver, self._train_dir)
        message += ': wrote %s' % path
      except Exception as e:  # pylint: disable=broad-except
        # A lost ps closes the session (MonitoredSession waits for it):
        # that ps is the cause, not "Attempted to use a closed Session".
        last, _ = checkpoints.newest_readable(self._train_dir)
        lost = cluster_runtime.lost_ps(self._ps_hosts)
        message += ': could not write a checkpoint%s; %s' % (
            ': %s cannot be reached' % lost if lost else
            ' (%s)' % checkpoints.first_line(e),
            'the last one, %s, is kept' % last if last else
            'there is none yet')
    print(message + '; exiting', file=sys.stderr, flush=True)
    self._exit(signum)

  def _exit_now(self, read_fd):
    self._exit(os.read(read_fd, 1)[0])

  @staticmethod
  def _exit(signum):
    exit_now(128 + signum)  # The main thread may be blocked in a step.


def exit_now(status):
  """Exits at once, whatever other threads wait for, with status."""
  sys.stdout.flush()
  log_filter.drain()  # os._exit skips atexit: get the last lines out.
  os._exit(status)


def finished(task_index, step, max_steps):
  """Says where this worker's training ended; returns the exit status: 0
  at max_steps, 1 before it or when the step is not known."""
  if step is None:
    return 1
  print('Worker %d: training finished at global step %d' % (task_index,
                                                            step),
        flush=True)
  return 0 if step >= max_steps else 1
