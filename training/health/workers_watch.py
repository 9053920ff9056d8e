"""The chief's watch on the other workers: lost, hung or lagging.

A worker seen once whose port then refuses or does not answer for
--lost_worker_secs is lost (liveness.Tracker); one that makes no step for
that long while the updates wait for it alone is hung (stragglers.PaceJudge).
Either is named, and in synchronous training the workers left compute its
share of each update: SyncReplicasOptimizer's tokens are not per worker,
but the token it took for its step in flight went with it, and with every
other worker waiting for a token and the update one gradient short,
nothing moves. When the chief sees that (no token in the queue, fewer
gradients than an update takes, the global step still) it puts that one
token back, at the global step. A worker that lags is set aside
(stragglers.StandAsideHook) and taken back when it keeps pace.
"""

import threading
import time

import tensorflow as tf

from training.graph import sync_protocol
from training.health import liveness
from training.health import stragglers

tf1 = tf.compat.v1


class LostWorkersHook(tf1.train.SessionRunHook):
  """The chief's watch, in a thread: names workers lost, hung, lagging and
  back; gives back a lost worker's token; sets stragglers aside."""

  POLL_SECS = 0.5
  STALLED_LOOKS = 6  # Looks at a stalled update before a token goes back.

  def __init__(self, *, worker_hosts, ps_hosts, global_step, replicas=None,
               set_aside=True):
    """Args: worker_hosts, ps_hosts: the cluster's; global_step: the
    training graph's; replicas: gradients an update takes (synchronous), or
    None; set_aside: whether stragglers are set aside (--set_aside)."""
    self._hosts = worker_hosts
    self._ps_hosts = ps_hosts
    self._replicas = replicas
    self._set_aside = set_aside and bool(replicas)
    self._joined = sync_protocol.joined_sizes(len(worker_hosts))
    self._reads = self._refill = None
    if replicas:
      # A worker lost in its step may have given its gradients to one ps
      # only: the fewest any ps holds is what the update waits on.
      self._refill = sync_protocol.refill_token(global_step)
      self._reads = sync_protocol.watch_reads(global_step,
                                              len(worker_hosts))
      self._marks = [sync_protocol.set_aside(global_step, i)
                     for i in range(len(worker_hosts))]
    self._session = None
    self._pace = stragglers.PaceJudge(len(worker_hosts), liveness.LOST_SECS)
    # One read at a time each, so that none piles up on a hung ps.
    self._read, self._joins, self._refills = (
        liveness.BoundedRead(), liveness.BoundedRead(),
        liveness.BoundedRead())

  def after_create_session(self, session, coord):
    first = self._session is None
    self._session = session  # A new one after a lost ps.
    if self._replicas:  # A new session judges afresh: no one is aside.
      for i in range(1, len(self._hosts)):
        self._mark(i, 0)
        self._pace.forget(i)
    if first:
      threading.Thread(target=self._watch, daemon=True,
                       name='lost_workers').start()

  def _mark(self, worker, value):
    placeholder, write = self._marks[worker]
    liveness.BoundedRead()(self._session, write, {placeholder: value})

  def _watch(self):
    workers = liveness.Tracker(self._hosts)
    judge = self._pace
    others = range(1, len(self._hosts))  # The chief is 0.
    seen, lost, hung = set(), set(), {}  # hung: {worker: its steps then}.
    owed, stalled = set(), []  # The lost whose token is not back yet.
    read = self._read
    while True:
      down = workers.probe(others, answers=True)
      for i in others:
        if i in down:
          judge.away(i)  # Not there: the tracker's to judge, not a hang.
          if i in seen and i not in lost and workers.lost(i):
            self._lose(i, lost, owed, '%s for %d s' % (down[i],
                                                       workers.lost_secs),
                       len(seen))
        else:
          seen.add(i)
          if i in lost and i not in hung:
            self._back(i, lost, owed)
            judge.forget(i)  # Restarted: its first steps are slow.
      if len(seen) < len(self._hosts) - 1:
        seen = self._watched(seen)
      values = (read(self._session, self._reads)
                if self._reads is not None else None)
      if values is not None:
        values = sync_protocol.split_watch(values, len(self._hosts))
      if values and not self._ps_silent():
        self._judge(judge, values, seen - lost - set(down), lost, owed, hung)
      if owed and self._give_back_token(values, stalled):
        owed.pop()
      elif not owed:
        stalled.clear()
      time.sleep(self.POLL_SECS)

  def _judge(self, judge, values, active, lost, owed, hung):
    """Acts on what the judge concludes from one look."""
    _, _, step, progress = values
    for i, steps in list(hung.items()):
      if progress[sync_protocol.STEPS][i] != steps:  # It stepped again.
        del hung[i]
        self._back(i, lost, owed)
    for what, i, figures in judge.look(step, progress, active | {0}):
      if what == 'hung' and i not in lost:
        hung[i] = progress[sync_protocol.STEPS][i]
        self._lose(i, lost, owed, 'no step for %d s while the others waited '
                   'on it; its port takes connections' % figures,
                   len(active - {0}))
      elif what == 'aside' and self._set_aside:
        self._mark(i, 1)
        print('Worker 0: worker %d at %s lags: the updates waited for it '
              'alone %d%% of the last %d s (%.1f steps a second against '
              'about %.1f for the others); set aside, the others make its '
              'share of each update of %d gradients, and it is taken back '
              'once it keeps pace' % (
                  i, self._hosts[i], round(100 * figures[2]),
                  judge.WINDOW_SECS, figures[0], figures[1], self._replicas),
              flush=True)
      elif what == 'aside':
        judge.aside.discard(i)
      elif what == 'back':
        self._mark(i, 0)
        print('Worker 0: worker %d at %s %s; taken back' % (
            i, self._hosts[i], 'keeps pace again (a trial step in %d ms, %d '
            'ms when set aside)' % figures if len(figures) == 2 else
            'has been aside for %d s' % figures), flush=True)

  def _ps_silent(self):
    """Whether a ps takes connections but does not answer: then no worker
    is judged (a hung ps is not N hung workers)."""
    return any(liveness.silent(host, 1.0) for host in self._ps_hosts)

  def _lose(self, i, lost, owed, why, num_seen):
    lost.add(i)
    if i in self._pace.aside:  # It gave its token back when set aside.
      self._pace.forget(i)
      self._mark(i, 0)
    elif self._replicas:
      owed.add(i)
    print(self._lost_line(i, why, 1 + num_seen - len(lost)), flush=True)

  def _back(self, i, lost, owed):
    lost.discard(i)
    owed.discard(i)
    print('Worker 0: worker %d at %s is back; it trains again' % (
        i, self._hosts[i]), flush=True)

  def _watched(self, seen):
    """The workers known to have run: joined, or seen on their port."""
    sizes = self._joins(self._session, self._joined)
    if sizes is None:
      return seen  # A ps lost: said on its own.
    return seen | {i for i, size in enumerate(sizes) if size and i}

  def _lost_line(self, i, why, left):
    """Args: left: the workers left, the chief included."""
    if not self._replicas:
      share = 'the %d left train on' % left
    elif left >= self._replicas:  # It was a backup: nothing to make up.
      share = 'the %d left make each update of %d gradients' % (
          left, self._replicas)
    else:
      share = 'the %d left compute its share of each update of %d gradients' % (
          left, self._replicas)
    return ('Worker 0: lost worker %d at %s (%s); %s; start it again and it '
            'rejoins' % (i, self._hosts[i], why, share))

  def _give_back_token(self, values, stalled):
    """Puts one token back once the updates have stalled for STALLED_LOOKS
    looks in a row (no token, an update short of gradients, the same global
    step); returns whether it did."""
    if values is None:
      return False  # The session ended, or a ps was lost: said elsewhere.
    size, gradients, step, _ = values
    if size or gradients >= self._replicas or (stalled and
                                               stalled[-1] != step):
      stalled.clear()
      return False
    stalled.append(step)
    if len(stalled) < self.STALLED_LOOKS:
      return False
    stalled.clear()
    # Pending counts as done: the enqueue lands when the ps answers.
    return (self._refills(self._session, self._refill) is not None or
            self._refills.pending())
