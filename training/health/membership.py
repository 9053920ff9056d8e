"""Who of the cluster is there: the workers that joined, and the chief.

Three session hooks that watch from threads and name what is missing, as
liveness.WaitReporter does before the session: JoinedWorkersHook, the
listed workers a synchronous chief goes on without; ChiefWatchHook, a lost
or hung chief, for which the other workers wait; PsWatchHook, a hung ps.
Whether a task is lost is liveness.Tracker's to say; the queues they read
are sync_protocol's. The chief's watch on the workers is workers_watch.py.
"""

import threading
import time

import tensorflow as tf

from training.graph import sync_protocol
from training.health import liveness

tf1 = tf.compat.v1


class JoinedWorkersHook(tf1.train.SessionRunHook):
  """Each worker says on ps 0 that it has joined; the chief of a synchronous
  run names the listed workers that have not.

  Without it, a synchronous chief whose fellow workers never came takes
  their tokens too and trains alone, slowly, and nothing says why.
  """

  def __init__(self, task_index, worker_hosts, replicas):
    self._task_index = task_index
    self._worker_hosts = worker_hosts
    self._replicas = replicas
    self._sizes = sync_protocol.joined_sizes(len(worker_hosts))
    self._post = sync_protocol.post_joined(len(worker_hosts), task_index)

  def after_create_session(self, session, coord):
    # Once: a restarted worker has joined already (and its queue holds one
    # slot). Only this worker writes to its queue, so there is no race.
    if not session.run(self._sizes[self._task_index]):
      session.run(self._post)
    if self._task_index == 0 and self._replicas:  # Synchronous.
      threading.Thread(target=self._watch, args=(session,), daemon=True,
                       name='joined_workers').start()

  def _missing(self, session):
    sizes = liveness.BoundedRead()(session, self._sizes)
    if sizes is None:
      raise RuntimeError('no answer from ps 0')  # Said on its own.
    return [i for i, size in enumerate(sizes) if not size]

  def _watch(self, session):
    """Looks every second; names the missing at liveness.Cadence, and says
    when they are all there."""
    cadence, reported = liveness.Cadence(), False
    try:
      while True:
        time.sleep(1)
        missing = self._missing(session)
        if not missing:
          break
        if cadence.due():
          print('Worker 0: waiting for %s to join; meanwhile the workers '
                'that have joined compute its share of the %d gradients per '
                'step' % (liveness.workers_named(
                    missing, self._worker_hosts), self._replicas), flush=True)
          reported = True
    except (tf.errors.OpError, RuntimeError):
      return  # The session ended, or a ps was lost: a new one starts over.
    if reported:
      print('Worker 0: all %d workers have joined' % len(self._worker_hosts),
            flush=True)


class ChiefWatchHook(tf1.train.SessionRunHook):
  """A worker's watch on the chief: says when it is lost and when it is
  back, and pauses this worker meanwhile.

  Only the chief writes checkpoints (and, synchronous, runs the updates):
  workers that trained on without it would make steps no one saves, which
  the returning chief's restore would undo. So they wait; the chief that
  comes back keeps the model the ps tasks hold (SessionCreator). A chief
  lost (liveness.Tracker, --lost_worker_secs) with the global step at
  max_steps is one that finished.
  """

  POLL_SECS = 2

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
    step = liveness.BoundedRead(10)(self._session, self._global_step)
    return step is not None and step >= self._max_steps

  def _watch(self):
    chief = liveness.Tracker([self._chief_host])
    while True:
      time.sleep(self.POLL_SECS)
      if not chief.probe(timeout=2.0, answers=True):
        if not self._present.is_set():
          print('%s: the chief, worker 0 at %s, is back; going on' % (
              self._name, self._chief_host), flush=True)
          self._present.set()
      elif self._present.is_set() and chief.lost(0):
        if self._finished():
          return
        self._present.clear()
        print('%s: lost the chief, worker 0 at %s (%s); no checkpoint is '
              'written until it is back, and the steps since its last one '
              'are only on the ps tasks, which keep them: start it again '
              'and it goes on from there. This worker waits for it' % (
                  self._name, self._chief_host, chief.why(0)), flush=True)


class PsWatchHook(tf1.train.SessionRunHook):
  """A worker's watch on the ps tasks: names one that takes connections but
  does not answer for --lost_worker_secs (a hung machine), and says when it
  answers again. Only a gRPC call with a deadline, beside the session: the
  training waits for the ps as before, and nothing else changes. A ps that
  refuses connections is a lost task, said by liveness.ReportLostTask."""

  POLL_SECS = 2

  def __init__(self, task_index, ps_hosts):
    self._name = 'Worker %d' % task_index
    self._hosts = ps_hosts
    self._started = False

  def after_create_session(self, session, coord):
    if not self._started:
      self._started = True
      threading.Thread(target=self._watch, daemon=True,
                       name='ps_watch').start()

  def _watch(self):
    ps, named = liveness.Tracker(self._hosts), set()
    while True:
      time.sleep(self.POLL_SECS)
      down = ps.probe(answers=True)
      for i, host in enumerate(self._hosts):
        if down.get(i) == liveness.NOT_ANSWERING and ps.lost(i):
          if i not in named:
            named.add(i)
            print('%s: ps %d at %s takes connections but has not answered '
                  'for %d s: check that machine (its load, memory, disk and '
                  'network); training waits for it' % (
                      self._name, i, host, ps.lost_secs), flush=True)
        elif i in named and i not in down:
          named.discard(i)
          print('%s: ps %d at %s answers again' % (self._name, i, host),
                flush=True)
