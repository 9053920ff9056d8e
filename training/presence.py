"""Who of the cluster is there: the workers that joined, and the chief.

Three session hooks that watch from threads and name what is missing, as
liveness.WaitReporter does before the session: JoinedWorkersHook, the
listed workers a synchronous chief goes on without; ChiefWatchHook, a lost
chief, for which the other workers wait; LostWorkersHook, the chief's watch
on workers lost for good, whose token it gives back. Whether a task is lost
is liveness.Tracker's to say; the queues they read are sync_protocol's.
"""

import threading
import time

import tensorflow as tf

from training import liveness
from training import sync_protocol

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
    return [i for i, size in enumerate(session.run(self._sizes)) if not size]

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
    try:
      return self._session.run(self._global_step, options=tf1.RunOptions(
          timeout_in_ms=10000)) >= self._max_steps
    except (tf.errors.OpError, RuntimeError):
      return False  # A ps lost too: that is said on its own.

  def _watch(self):
    chief = liveness.Tracker([self._chief_host])
    while True:
      time.sleep(self.POLL_SECS)
      if not chief.probe(timeout=2.0):
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


class LostWorkersHook(tf1.train.SessionRunHook):
  """The chief's watch on the other workers: names one lost for good, and
  in synchronous training gives the workers left the token it held.

  A worker seen once that liveness.Tracker then finds lost is named. The
  updates go on without it: SyncReplicasOptimizer's tokens are not per
  worker, so the workers left compute its share of each update, but the
  token it took for its step in flight went with it, and with every other
  worker waiting for a token and the update one gradient short, nothing
  moves. When the chief sees that (no token in the queue, fewer gradients
  than an update takes, the global step still) it puts that one token back,
  at the global step: the update gets its gradients, and no token piles up.
  """

  POLL_SECS = 1

  def __init__(self, *, worker_hosts, global_step, replicas=None):
    """Args: worker_hosts: the listed workers; global_step: the training
    graph's; replicas: gradients an update takes (synchronous), or None."""
    self._hosts = worker_hosts
    self._replicas = replicas
    self._reads = self._refill = None
    self._joined = sync_protocol.joined_sizes(len(worker_hosts))
    if replicas:
      # A worker lost in its step may have given its gradients to one ps
      # only: the fewest any ps holds is what the update waits on.
      self._refill = sync_protocol.refill_token(global_step)
      self._reads = [sync_protocol.token_queue(global_step).size(),
                     sync_protocol.fewest_gradients(),
                     global_step.read_value()]
    self._session = None

  def after_create_session(self, session, coord):
    first = self._session is None
    self._session = session  # A new one after a lost ps.
    if first:
      threading.Thread(target=self._watch, daemon=True,
                       name='lost_workers').start()

  def _watched(self, seen):
    """The workers known to have run: joined, or seen on their port."""
    try:
      sizes = self._session.run(self._joined, options=tf1.RunOptions(
          timeout_in_ms=5000))
    except (tf.errors.OpError, RuntimeError):
      return seen  # A ps lost: said on its own.
    return seen | {i for i, size in enumerate(sizes) if size and i}

  def _watch(self):
    workers = liveness.Tracker(self._hosts)
    others = range(1, len(self._hosts))  # The chief is 0.
    seen, lost = set(), set()
    owed, stalled = set(), []  # The lost whose token is not back yet.
    while True:
      down = workers.probe(others)
      for i in others:
        if i not in down:
          if i in lost:
            lost.discard(i)
            owed.discard(i)
            print('Worker 0: worker %d at %s is back; it trains again' % (
                i, self._hosts[i]), flush=True)
          seen.add(i)
        elif i in seen and i not in lost and workers.lost(i):
          lost.add(i)
          if self._replicas:
            owed.add(i)
          print(self._lost_line(i, down[i], len(lost), workers.lost_secs),
                flush=True)
      if len(seen) < len(self._hosts) - 1:
        seen = self._watched(seen)
      if owed and self._give_back_token(stalled):
        owed.pop()
      time.sleep(self.POLL_SECS)

  def _lost_line(self, i, why, num_lost, lost_secs):
    left = len(self._hosts) - num_lost
    if not self._replicas:
      share = 'the %d left train on' % left
    elif left >= self._replicas:  # It was a backup: nothing to make up.
      share = 'the %d left make each update of %d gradients' % (
          left, self._replicas)
    else:
      share = 'the %d left compute its share of each update of %d gradients' % (
          left, self._replicas)
    return ('Worker 0: lost worker %d at %s (%s for %d s); %s; start it again '
            'and it rejoins' % (i, self._hosts[i], why, lost_secs, share))

  def _give_back_token(self, stalled):
    """Puts one token back once the updates have stalled for 3 polls in a
    row (no token, an update short of gradients, the same global step);
    returns whether it did."""
    try:
      size, gradients, step = self._session.run(
          self._reads, options=tf1.RunOptions(timeout_in_ms=5000))
    except (tf.errors.OpError, RuntimeError):
      return False  # The session ended, or a ps was lost: said elsewhere.
    if size or gradients >= self._replicas or (stalled and
                                               stalled[-1] != step):
      stalled.clear()
      return False
    stalled.append(step)
    if len(stalled) < 3:
      return False
    stalled.clear()
    try:
      self._session.run(self._refill)
    except (tf.errors.OpError, RuntimeError):
      return False  # The queue closed: training is over.
    return True
