"""Who of the cluster is there: the workers that joined, and the chief.

Two session hooks that watch from threads and name what is missing, as
cluster_runtime.WaitReporter does before the session: JoinedWorkersHook,
the listed workers a synchronous chief goes on without; ChiefWatchHook, a
lost chief, for which the other workers wait.
"""

import threading
import time

import tensorflow as tf

from training import cluster_runtime

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


class ChiefWatchHook(tf1.train.SessionRunHook):
  """A worker's watch on the chief: says when it is lost and when it is
  back, and pauses this worker meanwhile.

  Only the chief writes checkpoints (and, synchronous, runs the updates):
  workers that trained on without it would make steps no one saves, which
  the returning chief's restore would undo. So they wait; the chief that
  comes back keeps the model the ps tasks hold (SessionCreator). Its server
  takes connections while it runs, so a connection refused or timed out for
  GONE_SECS is a lost chief, or, with the global step at max_steps, one
  that finished.
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
