"""The pace of synchronous workers: the chief's judgement, and a straggler
standing aside.

Each step marks on the global step's ps the local step its gradients were
for, and counts itself (sync_protocol.mark_progress). An update waits for
a worker when every other worker has given its gradient for the global step
and that one has not: it is behind alone. The chief looks twice a second
(PaceJudge): a worker behind alone for --lost_worker_secs without a step is
hung; one behind alone in at least half of the looks of the last
WINDOW_SECS is a straggler, set aside: it gives back the token it holds,
stops taking tokens, and the others make its share of each update, which
still takes replicas_to_aggregate gradients (StandAsideHook). Aside, it
times trial steps every TRIAL_SECS; it is taken back once those take at
most BACK_SHARE of the time they took when it was set aside (it lagged by
2x or more), or after AGAIN_SECS aside (doubled each time) to see. The
chief is never set aside: it writes the checkpoints.
"""

import collections
import statistics
import time

import tensorflow as tf

from training.graph import sync_protocol

tf1 = tf.compat.v1


class PaceJudge:
  """What the chief concludes from its looks at the progress table."""

  WINDOW_SECS = 10
  GAP_SECS = 3  # Looks further apart than this: the clocks start over.
  MIN_LOOKS = 10  # In the window, before a worker is judged a straggler.
  BEHIND_SHARE = 0.5
  BACK_SHARE = 0.6
  AGAIN_SECS = 60

  def __init__(self, num_workers, lost_secs, clock=time.time):
    self._n = num_workers
    self._lost_secs = lost_secs
    self._clock = clock
    self._looks = collections.deque()  # (time, global step, behind, steps)
    self.aside = set()
    self._aside_state = {}  # {worker: since, slowness, first trial ms}.
    self._again_secs = {}  # {worker: secs aside before it is tried again}.
    self._stepped = {}  # {worker: (its steps, since when)}.
    self._first = {}  # {worker: when a step of it was first seen here}.

  def look(self, global_step, progress, active):
    """Records a look; returns what to do now.

    Args:
      global_step: The global step read with progress.
      progress: The progress table read (sync_protocol.read_progress):
        rows APPLIED, STEPS, ASIDE, TRIAL_MS, a column a worker.
      active: The workers to judge: joined, not lost.

    Returns:
      [(what, worker, figures)]: ('hung', i, secs without a step),
      ('aside', i, (its steps/s, the others' steps/s, share behind)),
      ('back', i, (its trial ms, its first trial ms aside)) or ('back', i,
      (secs aside,)) when taken back to see.
    """
    now = self._clock()
    applied, steps = progress[sync_protocol.APPLIED], progress[
        sync_protocol.STEPS]
    if self._looks and now - self._looks[-1][0] > self.GAP_SECS:
      # No look for a while (a ps that did not answer): no one is judged
      # on that time.
      self._looks.clear()
      self._stepped = {i: (s, now if t is not None else None)
                       for i, (s, t) in self._stepped.items()}
    previous = self._looks[-1][3] if self._looks else None
    for i in range(self._n):
      if i not in self._stepped:
        self._stepped[i] = (steps[i], None)  # Not judged before a step.
      elif self._stepped[i][0] != steps[i]:
        self._stepped[i] = (steps[i], now)
        self._first.setdefault(i, now)
    # Those training, since a step of theirs seen here; the chief too, but
    # it is judged by the others (ChiefWatchHook), never here.
    training = [i for i in sorted(active) if i not in self.aside and
                i in self._first]
    behind = [i for i in training if applied[i] < global_step]
    alone = (behind[0] if len(behind) == 1 and len(training) > 1 and
             behind[0] != 0 else None)
    # Behind a look in which it made a step: a straggler's pace, not a
    # pause (a pause of lost_secs is a hang).
    lagging = (alone if alone is not None and previous is not None and
               steps[alone] != previous[alone] else None)
    self._looks.append((now, global_step, lagging, list(steps)))
    while self._looks[0][0] < now - self.WINDOW_SECS:
      self._looks.popleft()
    actions = []
    if alone is not None:
      still = now - self._stepped[alone][1]
      if still >= self._lost_secs:
        actions.append(('hung', alone, still))
    actions += self._stragglers(now, training)
    actions += self._returns(progress, now)
    return actions

  def _stragglers(self, now, training):
    """('aside', i, ...) for the one behind alone in most looks, if any."""
    looks = [l for l in self._looks if l[0] >= now - self.WINDOW_SECS]
    if (len(looks) < self.MIN_LOOKS or len(training) < 2 or
        now - looks[0][0] < self.WINDOW_SECS / 2):
      return []
    counts = collections.Counter(l[2] for l in looks if l[2] is not None)
    if not counts:
      return []
    worker, count = counts.most_common(1)[0]
    share = count / len(looks)
    if (worker not in training or share < self.BEHIND_SHARE or
        now - self._first[worker] < 2 * self.WINDOW_SECS or
        now - self._stepped[worker][1] >= self._lost_secs / 2):
      # Fast enough; just started or back (its first steps are slow); or
      # stopped (hung?).
      return []
    # The others wait for it alone share of the time: its steps take about
    # 1 / (1 - share) times theirs (their rate is its rate, in rounds).
    slowness = 1 / max(1 - share, 0.05)
    self.aside.add(worker)
    self._aside_state[worker] = dict(since=now, first_ms=None)
    self._again_secs.setdefault(worker, self.AGAIN_SECS)
    rate = self._rates(looks)[worker]
    self._looks.clear()  # The pace changes: judge it afresh.
    return [('aside', worker, (rate, rate * slowness, share))]

  def away(self, worker):
    """Worker's port does not answer now (liveness.Tracker's to judge): its
    time without a step counts again from when it answers, so that a hang
    is a pause with its port answering all along."""
    if self._stepped.get(worker, (None, None))[1] is not None:
      self._stepped[worker] = (self._stepped[worker][0], self._clock())

  def forget(self, worker):
    """Judges worker afresh from its next step: it was lost and is back
    (restarted), or taken back; no longer aside."""
    self._stepped.pop(worker, None)
    self._first.pop(worker, None)
    self.aside.discard(worker)

  def _rates(self, looks):
    """{worker: steps a second} over looks."""
    (then, _, _, first), (now, _, _, last) = looks[0], looks[-1]
    return {i: (last[i] - first[i]) / max(now - then, 1e-9)
            for i in range(self._n)}

  def _returns(self, progress, now):
    """('back', i, ...) for each worker aside that keeps pace again: its
    trial steps at most BACK_SHARE as long as when set aside (it lagged by
    2x or more), or aside for AGAIN_SECS (doubled at each return): taken
    back to see."""
    actions = []
    for i in sorted(self.aside):
      state = self._aside_state[i]
      trial_ms = progress[sync_protocol.TRIAL_MS][i]
      if trial_ms >= 0 and state['first_ms'] is None:
        state['first_ms'] = trial_ms
      kept_pace = (state['first_ms'] is not None and 0 <= trial_ms <=
                   state['first_ms'] * self.BACK_SHARE)
      if kept_pace or now - state['since'] >= self._again_secs[i]:
        self.aside.discard(i)
        self._looks.clear()
        self.forget(i)  # Judged again from its next step, after its warmup.
        self._again_secs[i] *= 2
        actions.append(('back', i, (trial_ms, state['first_ms'])
                        if kept_pace else (round(now - state['since']),)))
    return actions


class StandAsideHook(tf1.train.SessionRunHook):
  """A synchronous worker's side of being set aside: between two of its
  steps, while the chief's mark is on, it gives back its token, times
  trial steps every TRIAL_SECS (the median of its last 3 times posted), and
  once taken back takes a token again and goes on. Each step brings the
  mark back with it (sync_protocol.aside_seen), so no poll asks ps 0."""

  TRIAL_SECS = 2
  TRIAL_RUN_SECS = 0.2

  def __init__(self, *, task_index, global_step, gradients, max_steps):
    self._name = 'Worker %d' % task_index
    self._global_step = global_step
    self._max_steps = max_steps
    self._trial = tf.group(*gradients)
    self._flag = sync_protocol.aside_flag(global_step, task_index)
    self._seen = sync_protocol.aside_seen(global_step, task_index)
    self._post = sync_protocol.set_value(global_step, sync_protocol.TRIAL_MS,
                                         task_index)
    self._give_back = sync_protocol.give_back_own_token(global_step)
    self._take = sync_protocol.take_token(global_step)

  def before_run(self, run_context):
    return tf1.train.SessionRunArgs(self._seen)

  def trial_ms(self, session):
    """Runs trial steps (their gradients, not applied) for TRIAL_RUN_SECS,
    at least one; returns the ms a step took: several, so that a machine
    that lags by the moment is measured over its moments."""
    start, count = time.time(), 0
    while not count or time.time() - start < self.TRIAL_RUN_SECS:
      session.run(self._trial)
      count += 1
    return (time.time() - start) * 1000 / count

  def after_run(self, run_context, run_values):
    if run_values.results is None or run_values.results <= 0:
      return
    session = run_context.session
    try:
      session.run(self._give_back)
    except (tf.errors.OutOfRangeError, tf.errors.CancelledError):
      run_context.request_stop()  # The chief closed the tokens: the end.
      return
    trials = collections.deque([self.trial_ms(session) for _ in range(3)],
                               maxlen=3)
    self._post_median(session, trials)
    print('%s: set aside by the chief (a trial step takes %d ms here); the '
          'others make its share of each update while it times one every '
          '%d s' % (self._name, statistics.median(trials), self.TRIAL_SECS),
          flush=True)
    while session.run(self._flag) > 0:
      if session.run(self._global_step) >= self._max_steps:
        run_context.request_stop()
        return
      time.sleep(self.TRIAL_SECS)
      trials.append(self.trial_ms(session))
      self._post_median(session, trials)
    try:
      session.run(self._take)
    except (tf.errors.OutOfRangeError, tf.errors.CancelledError):
      run_context.request_stop()  # The chief closed the tokens: the end.
      return
    print('%s: taken back by the chief; it trains again' % self._name,
          flush=True)

  def _post_median(self, session, trials):
    session.run(self._post[1], {self._post[0]: round(
        statistics.median(trials))})
