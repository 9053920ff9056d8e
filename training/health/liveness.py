"""Liveness: whether the other tasks of the cluster are there, in one room.

A task's gRPC server takes connections while the task runs, so a port that
refuses them (the task is gone) or does not answer (its machine is gone) is
a task not there; one not there for --lost_worker_secs counts as lost, for
every role: the ps's wait at the end, the chief's watch on the workers, a
worker's watch on the chief. Tracker keeps, per task, since when it is not
there and since when it made no progress. What a task waits for is said
after --wait_report_secs, then every twice that (Cadence, WaitReporter).
configure() sets both from the flags, once, in the entry point. A task lost
in the middle of a step is TensorFlow's to see: LOST_TASK_ERRORS are the
errors it raises then, and ReportLostTask says it in one line.
"""

import logging
import socket
import sys
import threading
import time

import grpc
import tensorflow as tf

from training.runtime import log_filter

# --lost_worker_secs and --wait_report_secs; configure() sets them.
LOST_SECS = 10
REPORT_SECS = 10

# Why a task that takes connections is not there (Tracker.probe).
NOT_ANSWERING = 'takes connections but does not answer'

# What a step, a save or a read fails with when a task of the cluster is
# lost (a step spanning several tasks reports whichever part failed first).
LOST_TASK_ERRORS = (tf.errors.UnavailableError, tf.errors.AbortedError,
                    tf.errors.CancelledError)


def configure(*, lost_secs, report_secs):
  """Sets when a task counts as lost, and when a wait is first said."""
  global LOST_SECS, REPORT_SECS
  LOST_SECS, REPORT_SECS = lost_secs, report_secs


def unreachable(hosts, timeout=2.0):
  """Returns [(index, host:port, why)] of the hosts that take no connection.

  A plain TCP connect: what a task not started, a wrong port or a wrong
  host fails first; TensorFlow itself only waits, and says so in INFO.
  """
  missing = []
  for i, address in enumerate(hosts):
    host, _, port = address.rpartition(':')
    try:
      socket.create_connection((host.strip('[]'), int(port)), timeout).close()
    except OSError as e:
      missing.append((i, address, e.strerror or str(e)))
  return missing


def silent(address, timeout=2.0):
  """Whether a task that takes connections does not answer: its gRPC server
  (TensorFlow's WorkerService.GetStatus) gives no reply within timeout, as
  a hung machine or a stopped process. A plain gRPC call, beside any
  session: it never waits longer than timeout."""
  channel = grpc.insecure_channel(address)
  try:
    channel.unary_unary('/tensorflow.WorkerService/GetStatus')(
        b'', timeout=timeout)  # An empty GetStatusRequest.
    return False
  except grpc.RpcError as e:
    return e.code() == grpc.StatusCode.DEADLINE_EXCEEDED
  finally:
    channel.close()


def workers_named(indices, worker_hosts):
  """'worker 1 at host:port, worker 2 at host:port'."""
  return ', '.join('worker %d at %s' % (i, worker_hosts[i])
                   for i in sorted(indices))


def name_ps(missing):
  """'ps 1 at host:port (Connection refused), ...' for unreachable()'s
  list of ps tasks."""
  return ', '.join('ps %d at %s (%s)' % m for m in missing)


def lost_ps(ps_hosts):
  """name_ps() of the ps tasks that take no connection; None if none."""
  return name_ps(unreachable(ps_hosts)) or None


class Tracker:
  """Since when each task of a list is not there, and since when it made
  no progress; either for lost_secs (--lost_worker_secs) and it is lost.

  probe() tries the ports; progress() is told of a task's steps by whoever
  sees them. A task that answers again starts over.
  """

  def __init__(self, hosts, lost_secs=None, clock=time.time):
    """Args: hosts: the tasks' host:port; lost_secs: None for LOST_SECS;
    clock: returns the time in seconds (a test's own)."""
    self.hosts = list(hosts)
    self.lost_secs = LOST_SECS if lost_secs is None else lost_secs
    self._clock = clock
    self._away = {}  # {index: (why, since when)}: its port takes nothing.
    self._progress = {}  # {index: when it last made progress}.

  def probe(self, indices=None, timeout=1.0, answers=False):
    """Tries the ports of indices (all by default); returns {index: why}
    of those that took no connection or, with answers, that took one but
    did not answer (silent())."""
    indices = range(len(self.hosts)) if indices is None else list(indices)
    down = {indices[j]: why for j, _, why in unreachable(
        [self.hosts[i] for i in indices], timeout)}
    if answers:
      down.update({i: NOT_ANSWERING for i in indices
                   if i not in down and silent(self.hosts[i], 2 * timeout)})
    self.observe(down, indices)
    return down

  def observe(self, down, indices):
    """Records what a probe of indices found: {index: why} not there."""
    now = self._clock()
    for i in indices:
      if i in down:
        self._away[i] = (down[i], self._away.get(i, (None, now))[1])
      else:
        self._away.pop(i, None)

  def progress(self, index, when=None):
    """Records that task index made progress (a step) at when (now)."""
    self._progress[index] = self._clock() if when is None else when

  def away_secs(self, index):
    """Seconds task index has not been there; 0 while it is."""
    return self._clock() - self._away[index][1] if index in self._away else 0

  def why(self, index):
    """What its last probe failed with ('Connection refused'), or None."""
    return self._away.get(index, (None, 0))[0]

  def lost(self, index):
    """Whether task index has not been there for lost_secs."""
    return index in self._away and self.away_secs(index) >= self.lost_secs

  def still_secs(self, index):
    """Seconds since task index last made progress (None: never told)."""
    if index not in self._progress:
      return None
    return self._clock() - self._progress[index]


class BoundedRead:
  """Runs a session read in a thread of its own, waiting at most secs: a
  watch thread never blocks on a hung ps. One read at a time: while one
  still waits, the next is not tried."""

  def __init__(self, secs=5.0):
    self._secs = secs
    self._pending = None

  def __call__(self, session, fetches, feed_dict=None):
    """Returns the fetches' values, or None (no answer in secs, a read still
    pending, or an error: the session ended, a ps was lost)."""
    if self._pending is not None and self._pending.is_alive():
      return None
    result = []

    def run():
      try:
        result.append(session.run(fetches, feed_dict))
      except (tf.errors.OpError, RuntimeError):
        pass  # The session ended, or a ps was lost: said elsewhere.

    self._pending = threading.Thread(target=run, daemon=True,
                                     name='bounded_read')
    self._pending.start()
    self._pending.join(self._secs)
    return result[0] if result else None

  def pending(self):
    """Whether the last read still waits for its answer."""
    return self._pending is not None and self._pending.is_alive()


class Cadence:
  """When to say a wait: after REPORT_SECS (--wait_report_secs), then every
  twice that."""

  def __init__(self, first_secs=None, clock=time.time):
    self._clock = clock
    self.first_secs = REPORT_SECS if first_secs is None else first_secs
    self._next = clock() + self.first_secs

  def due(self):
    """Whether to say it now; if so, the next time is twice the first on."""
    if self._clock() < self._next:
      return False
    self._next = self._clock() + 2 * self.first_secs
    return True


class WaitReporter:
  """While a block runs, prints what it waits for, at the Cadence.

  Use as `with WaitReporter(describe):`, where describe() returns the line
  to print now, or None when there is nothing to say.
  """

  POLL_SECS = 0.5

  def __init__(self, describe):
    self._describe = describe
    self._done = threading.Event()

  def __enter__(self):
    threading.Thread(target=self._run, daemon=True, name='wait_report').start()
    return self

  def __exit__(self, *unused_exc_info):
    self._done.set()

  def _run(self):
    cadence = Cadence()
    while not self._done.wait(self.POLL_SECS):
      if cadence.due():
        line = self._describe()
        if line and not self._done.is_set():
          print(line, flush=True)


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
            'come back' % (self._task_index, log_filter.first_line(
                message.split(' Error: ', 1)[-1])), file=sys.stderr,
            flush=True)
    return False
