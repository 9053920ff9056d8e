"""The worker's session: its creation and recovery, and a step run in it.

SessionCreator polls for the chief every 0.5 s instead of 30 s, restores
the newest checkpoint that can be read (or keeps the model the ps tasks
still hold), and says what it waits for and when the cluster is back;
run_step recovers from a lost task that TensorFlow reports as a cancelled
step. The hooks are in hooks.py.
"""

import os
import sys

import tensorflow as tf

from training.health import liveness
from training.session.chief_start import say_as_chief
from training.storage import checkpoints
from training.storage import partial_restore

tf1 = tf.compat.v1

# How often a worker that waits for the chief to initialize the model looks
# again. The stock session creators poll every 30 s, which a synchronous
# chief then spends waiting for that worker's first gradients.
RECOVERY_WAIT_SECS = 0.5


def run_step(sess, fetches):
  """Runs one training step in the MonitoredSession; returns the fetches.

  MonitoredSession recovers from a step that raises AbortedError or
  UnavailableError. A step spans several tasks, and when a ps dies during
  it the error is that of whichever part reported first, which can be
  CancelledError. Nothing here cancels a step (a signal exits the process),
  so a cancelled step is a lost task: it is raised again as AbortedError
  inside run_step_fn, where MonitoredSession's recovery sees it.
  """
  def step_fn(step_context):
    try:
      return step_context.run_with_hooks(fetches)
    except tf.errors.CancelledError as e:
      raise tf.errors.AbortedError(e.node_def, e.op, e.message) from e

  return sess.run_step_fn(step_fn)


class SessionCreator(tf1.train.SessionCreator):
  """ChiefSessionCreator / WorkerSessionCreator with a short recovery wait,
  the newest readable checkpoint, the model the ps tasks still hold, and a
  word on what it waits for.

  The stock creators poll every 30 s (here RECOVERY_WAIT_SECS), restore the
  latest checkpoint even when its files are damaged, wait without a word for
  a ps that was never started or does not answer, and a chief that comes
  back restores its last checkpoint over the newer model the ps tasks
  hold: here it keeps that one.
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
    self._rebuild = (partial_restore.Rebuild(resume.missing, shadows)
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
            partial_restore.can_rebuild(self._shadows))
    self._sessions += 1
    self._scaffold.finalize()
    manager = tf1.train.SessionManager(
        local_init_op=self._scaffold.local_init_op,
        ready_op=self._scaffold.ready_op,
        ready_for_local_init_op=self._scaffold.ready_for_local_init_op,
        graph=tf1.get_default_graph(),
        recovery_wait_secs=RECOVERY_WAIT_SECS)
    with liveness.WaitReporter(self._waiting_for):
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
    """Restores resume's checkpoint; the averages it lacks from their
    weights, the accumulators it lacks at zero."""
    if not resume.missing:
      self._scaffold.saver.restore(session, resume.path)
    elif self._rebuild and set(resume.missing) == self._rebuild.missing:
      say_as_chief(self._rebuild.restore(session, self._scaffold.init_op,
                                         resume.path))
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
    missing = liveness.unreachable(self._task.ps_hosts)
    if missing:
      return '%s: waiting for %s; start %s, or check --ps_hosts' % (
          self._name, liveness.name_ps(missing),
          'it' if len(missing) == 1 else 'them')
    # A stopped or hung ps still takes connections: a gRPC call with a
    # deadline finds it.
    hung = [(i, host, liveness.NOT_ANSWERING)
            for i, host in enumerate(self._task.ps_hosts)
            if liveness.silent(host)]
    if hung:
      return ('%s: waiting for %s: check that machine (its load, memory, '
              'disk and network)' % (self._name, liveness.name_ps(hung)))
    if not self._is_chief:
      return ('%s: waiting for the chief, worker 0 at %s, to initialize or '
              'restore the model' % (self._name, self._task.worker_hosts[0]))
    return None
