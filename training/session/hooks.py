"""The worker's session hooks: what MonitoredSession runs around its steps.

SyncReplicasHook starts and stops the chief's sync thread cleanly;
CheckpointSaverHook saves, and says in one line why a save failed;
SkippedStepsHook and LearningRateLineHook say what the loss scale and the
learning rate did; StopOnSignalHook makes SIGINT/SIGTERM checkpoint and
exit. Those that watch who is there are health's, the tracer tracing.py.
"""

import os
import signal
import sys
import threading

from google.protobuf import text_format
import tensorflow as tf

from training.graph import learning_rate
from training.graph import ps_gradients
from training.graph import sync_protocol
from training.health import liveness
from training.runtime import log_filter
from training.runtime import process
from training.runtime import tf_compat
from training.session import chief_start
from training.storage import checkpoints

tf1 = tf.compat.v1

_EVENTS = {}  # {train_dir: its FileWriter}: see events_writer().


def events_writer(train_dir):
  """The chief's writer of events in train_dir, made at first use.

  Not FileWriterCache's, which writes the graph and its meta graph into
  every new file, at every start (beside CheckpointSaverHook's, with
  shapes): here the graph is written once for each graph. A FileWriter
  makes its file with its first event: a start with no event makes none.
  """
  if train_dir not in _EVENTS:
    _EVENTS[train_dir] = tf1.summary.FileWriter(train_dir)
  return _EVENTS[train_dir]


class SyncReplicasHook(tf1.train.SessionRunHook):
  """SyncReplicasOptimizer.make_session_run_hook(), with a clean end.

  Runs the local init op, fills each ps's joined weights and this worker's
  copy of them (ps_gradients) and, on the chief, fills the token queue and
  runs the sync op in a thread. The stock hook has the coordinator join
  that thread, which at the end blocks in take_grad for gradients no worker
  sends. Here the thread ends with the session, and counts that and a lost
  ps (the training loop recovers) as normal; an update that failed with no
  task lost is said and run again; any other error goes to the coordinator.
  """

  def __init__(self, opt, is_chief, global_step):
    self._is_chief = is_chief
    self._fills = [ps_gradients.fill_joined_weights(chief=is_chief),
                   ps_gradients.fill_pulled_weights()]
    if is_chief:
      self._local_init_op = opt.chief_init_op
      self._init_tokens_op = opt.get_init_tokens_op()
      self._sync_op = opt.get_chief_queue_runner().enqueue_ops[0]
      self._refill = sync_protocol.refill_token(global_step)
    else:
      self._local_init_op = opt.local_step_init_op

  def after_create_session(self, session, coord):
    session.run([self._local_init_op, self._fills[0]])
    session.run(self._fills[1])  # After both: its local step's weights.
    if self._is_chief:
      session.run(self._init_tokens_op)
      threading.Thread(target=self._run_sync_op, args=(session, coord),
                       daemon=True, name='sync_replicas').start()

  def _run_sync_op(self, session, coord):
    while not coord.should_stop():
      try:
        session.run(self._sync_op)
      except (tf.errors.OutOfRangeError, RuntimeError):
        return  # The token queue or the session was closed: the end.
      except liveness.LOST_TASK_ERRORS as e:
        # Cancelled by the session's close (the coordinator stopped first),
        # or a ps went away. The training loop's step then fails the same
        # way and MonitoredSession recovers (reported to the coordinator,
        # this error would be raised again when the broken session closes,
        # and kill us); unless that step had given the lost ps its
        # gradients and waits, on another ps, for a token only this thread
        # would give: the token goes back, and its next step meets the lost
        # ps. The recovery stops this coordinator; if it does not come, the
        # step did not fail: without this thread every worker would wait
        # for its token forever.
        if coord.should_stop():
          return
        self._give_back_token(session)
        if coord.wait_for_stop(liveness.LOST_SECS):
          return
        print('Worker 0: an update of the gradients failed (%s: %s), yet '
              'the training steps go on: updating again' % (
                  type(e).__name__, log_filter.first_line(e)),
              file=sys.stderr, flush=True)
      except Exception as e:  # pylint: disable=broad-except
        coord.request_stop(e)
        return

  def _give_back_token(self, session):
    try:
      session.run(self._refill)
    except liveness.LOST_TASK_ERRORS + (RuntimeError,):
      pass  # The token queue's ps is lost too: the step fails with it.


class CheckpointSaverHook(tf1.train.SessionRunHook):
  """The chief's checkpoints: model.ckpt-N at session creation (unless the
  newest checkpoint holds that model already), every save_steps global steps
  and at the end; graph.pbtxt and the graph for TensorBoard at creation
  where the graph is not the one written last.

  A failed save raises checkpoints.WriteError, its temporary files removed,
  instead of a TensorFlow error in two chained tracebacks. A save lost with
  a ps is a lost task, from which MonitoredSession recovers; at the end it
  cannot, so the chief names the ps and exits 3 at once: closing the session
  would wait for that ps forever, and the ps tasks still there are not told
  the run is done (it is not): they wait for the restarted chief.
  """

  def __init__(self, train_dir, save_steps, scaffold, ps_hosts):
    """Args: scaffold: whose saver writes (it has one once the session is
    made); ps_hosts: named when one is lost."""
    self._train_dir = train_dir
    self._save_steps = save_steps
    self._scaffold = scaffold
    self._ps_hosts = ps_hosts
    self._global_step = self._last_saved = None
    self._ending = False

  def begin(self):
    self._global_step = tf1.train.get_global_step()
    # The read TensorFlow's hooks fetch in the step, where the packing made
    # one (tf_compat.one_step_read): the step then reads the step once.
    read = tf_compat.registered_step_read()
    self._step_read = self._global_step if read is None else read

  def after_create_session(self, session, coord):
    try:
      step = session.run(self._global_step)
      self._write_graph()
      if not self._saved_already(step):
        self._save(session, step)
      self._last_saved = step
    except liveness.LOST_TASK_ERRORS:
      raise  # MonitoredSession creates the session again once it is back.
    except tf.errors.OpError as e:
      raise checkpoints.write_failure(
          self._train_dir, session.run(self._global_step), e) from e

  def _write_graph(self):
    """graph.pbtxt, and the graph and meta graph for TensorBoard, unless
    graph.pbtxt holds this graph already: a start with the graph of the
    last adds nothing."""
    graph = tf1.get_default_graph()
    graph_def = graph.as_graph_def(add_shapes=True)
    try:
      with open(os.path.join(self._train_dir, 'graph.pbtxt')) as f:
        text = f.read()
      # As write_graph writes it: cheaper than parsing the file. (2.16's
      # writes floats another way: parsed where the text differs.)
      if (text == text_format.MessageToString(graph_def) or
          text_format.Parse(text, tf1.GraphDef()) == graph_def):
        return
    except (OSError, ValueError, text_format.ParseError):
      pass  # None yet, or not a graph: written again.
    writer = events_writer(self._train_dir)
    writer.add_graph(graph)
    writer.add_meta_graph(self._scaffold.saver.export_meta_graph())
    writer.flush()  # Before graph.pbtxt says it is written.
    tf1.train.write_graph(graph_def, self._train_dir, 'graph.pbtxt')

  def _saved_already(self, step):
    """Whether the newest checkpoint is of step, holds every variable and
    reads back whole: the model the session starts from (a finished run
    started again). One that is damaged is written anew."""
    newest = tf.train.latest_checkpoint(self._train_dir)
    if not newest or checkpoints.step_of(newest) != step:
      return False
    try:
      if checkpoints.missing_from(newest, tf1.global_variables()):
        return False
    except (tf.errors.OpError, ValueError):
      return False
    return checkpoints.unreadable(newest) is None

  def before_run(self, run_context):
    return tf1.train.SessionRunArgs(self._step_read)  # Read in the step.

  def after_run(self, run_context, run_values):
    if run_values.results + 1 < self._last_saved + self._save_steps:
      return  # Not near a save: no read of its own on the step's path.
    # Read after the step: in a cluster others move the global step too.
    step = run_context.session.run(self._global_step)
    if step >= self._last_saved + self._save_steps:
      self._last_saved = step
      self._save(run_context.session, step)

  def end(self, session):
    self._ending = True
    try:
      step = session.run(self._global_step)
      if step != self._last_saved:
        self._save(session, step)
      events_writer(self._train_dir).flush()  # Out before an exit.
      return
    except liveness.LOST_TASK_ERRORS as e:  # Before the save.
      error = checkpoints.write_failure(
          self._train_dir, None, e, liveness.lost_ps(self._ps_hosts) or
          log_filter.first_line(e))
    except checkpoints.LostPsError as e:  # The save's.
      error = e
    print('Error: %s' % error, file=sys.stderr, flush=True)
    process.exit_now(3)

  def _save(self, session, step):
    """Writes the checkpoint named after the step it holds (see
    checkpoints.save), logs it for TensorBoard, deletes the oldest."""
    saver = self._scaffold.saver
    try:
      checkpoints.save(saver, session, self._train_dir, step)
    except liveness.LOST_TASK_ERRORS as e:
      if not self._ending:
        raise  # A lost ps: MonitoredSession waits for it and recovers.
      raise checkpoints.write_failure(
          self._train_dir, step, e, liveness.lost_ps(self._ps_hosts) or
          log_filter.first_line(e)) from e
    except tf.errors.OpError as e:
      raise checkpoints.write_failure(self._train_dir, step, e) from e
    events_writer(self._train_dir).add_session_log(tf1.SessionLog(
        status=tf1.SessionLog.CHECKPOINT,
        checkpoint_path=os.path.join(self._train_dir, 'model.ckpt')), step)
    checkpoints.keep_newest(saver, self._train_dir)


class SkippedStepsHook(tf1.train.SessionRunHook):
  """The chief's line when float16's loss scaling skipped more steps.

  An overflowed step leaves the weights as they were (precision.LossScaled):
  a few while the scale finds its level are expected; many say the model's
  numbers do not fit float16. Said after a step only when the count grew.
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
      chief_start.say_as_chief(
          '%d steps so far had float16 gradients that overflowed; they left '
          'the weights as they were, and the loss scale is now %g' % (
              skipped, scale))


class LearningRateLineHook(tf1.train.SessionRunHook):
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


class StopOnSignalHook(tf1.train.SessionRunHook):
  """SIGINT or SIGTERM: the chief writes a checkpoint; the task exits now.

  A worker can sit in session.run for as long as another worker is down,
  and Python runs a signal handler only between bytecodes; the C handler
  still writes the signal to the wakeup fd, which a thread reads, saves
  and exits while the main thread stays blocked. A single process first
  lets its step in flight end (this is the last hook, so the others' saves
  are done too): the checkpoint is exactly the step it is named after. A
  second signal exits at once, without waiting for the save.
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
      message += ': ' + self._save()
    print(message + '; exiting', file=sys.stderr, flush=True)
    self._exit(signum)

  def _save(self):
    """Writes the checkpoint; returns what happened, for the message."""
    # A ps already lost is not asked: the main thread may be recreating the
    # session, waiting for that ps, and a run here would wait with it.
    lost, error = liveness.lost_ps(self._ps_hosts), None
    if not lost:
      try:
        path = checkpoints.save(
            self._scaffold.saver, self._session, self._train_dir,
            self._session.run(self._global_step))
        checkpoints.keep_newest(self._scaffold.saver, self._train_dir)
        return 'wrote %s' % path
      except Exception as e:  # pylint: disable=broad-except
        # A ps lost since closes the session (MonitoredSession waits for
        # it): that ps is the cause, not "Attempted to use a closed Session".
        lost, error = liveness.lost_ps(self._ps_hosts), e
    last, _ = checkpoints.newest_readable(self._train_dir)
    return 'could not write a checkpoint%s; %s' % (
        ': %s cannot be reached' % lost if lost else
        ' (%s)' % log_filter.first_line(error),
        'the last one, %s, is kept' % last if last else 'there is none yet')

  def _exit_now(self, read_fd):
    self._exit(os.read(read_fd, 1)[0])

  @staticmethod
  def _exit(signum):
    process.exit_now(128 + signum)  # The main thread may be blocked.
