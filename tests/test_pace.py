"""stragglers.PaceJudge on looks made by hand, against a clock the test sets: the
expectations are worked by hand, and no test waits."""

from training.health import stragglers


class Clock:
  """A clock that stands where the test puts it."""

  def __init__(self):
    self.now = 0.0

  def __call__(self):
    return self.now


def table(applied, steps, trial_ms=(-1, -1, -1)):
  """A progress table read: rows APPLIED, STEPS, ASIDE, TRIAL_MS."""
  return [list(applied), list(steps), [0, 0, 0], list(trial_ms)]


def straggling(judge, clock, looks, slow_in=(1, 2)):
  """Feeds looks twice a second at global steps 100, 101, ...: in the looks
  whose index % 3 is in slow_in, worker 2 alone has not given its gradient
  for the global step; every worker steps once a look. Returns the
  actions of each look."""
  actions = []
  for k in range(looks):
    clock.now = k * 0.5
    step = 100 + k
    behind = k % 3 in slow_in
    actions.append(judge.look(step, table(
        [step, step, step - 1 if behind else step], [k, k, k]), {1, 2}))
  return actions


def test_a_worker_the_updates_wait_for_alone_is_set_aside():
  clock = Clock()
  judge = stragglers.PaceJudge(3, lost_secs=5, clock=clock)
  actions = straggling(judge, clock, 52)
  # Not judged in its first 20 s (its first steps are slow): from its first
  # step seen (look 1, at 0.5 s) to look 41, at 20.5 s. Then worker 2 was
  # behind alone in 14 of the window's 21 looks (k = 21..41, k % 3 in 1, 2);
  # then judged afresh, aside.
  assert actions[:41] == [[]] * 41
  (what, worker, (its, theirs, share)), = actions[41]
  assert (what, worker) == ('aside', 2)
  assert share == 14 / 21
  assert its == 20 / 10  # Its steps: 21 to 41 in 10 s.
  assert abs(theirs - 6.0) < 1e-9  # Its rate / (1 - share).
  assert actions[42:] == [[]] * 10
  assert judge.aside == {2}


def test_equal_workers_are_left_alone():
  clock = Clock()
  judge = stragglers.PaceJudge(3, lost_secs=5, clock=clock)
  # Worker 2 last in a third of the looks, as any of three equal workers.
  assert straggling(judge, clock, 60, slow_in=(0,)) == [[]] * 60
  assert not judge.aside


def stopping(judge, clock, looks, away=()):
  """Feeds looks twice a second: worker 2's last step at look 2 (1 s); from
  then on the update waits on it alone. At the looks in away its port does
  not answer (judge.away, and it is not judged). Returns each look's
  actions."""
  actions = []
  for k in range(looks):
    clock.now = k * 0.5
    if k in away:
      judge.away(2)
    actions.append(judge.look(100 + min(k, 3), table(
        [100 + min(k, 3)] * 2 + [100 + min(k, 2)], [k, k, min(k, 2)]),
                              {1} if k in away else {1, 2}))
  return actions


def test_one_that_makes_no_step_while_the_others_wait_is_hung():
  clock = Clock()
  judge = stragglers.PaceJudge(3, lost_secs=5, clock=clock)
  actions = stopping(judge, clock, 14)
  assert actions[:12] == [[]] * 12  # 4.5 s without a step: not yet.
  assert actions[12] == [('hung', 2, 5.0)]
  assert not judge.aside  # Stopped, not slow: never set aside.


def test_a_hang_counts_from_when_its_port_answers_again():
  clock = Clock()
  judge = stragglers.PaceJudge(3, lost_secs=5, clock=clock)
  # Its port did not answer at 1.5 s to 3 s (looks 3 to 6).
  actions = stopping(judge, clock, 20, away=(3, 4, 5, 6))
  # Its last step at 1 s; counted from 3 s, the last look it was away: 5 s
  # without a step at 8 s (look 16), not at 6 s (look 12).
  assert actions[:16] == [[]] * 16
  assert actions[16] == [('hung', 2, 5.0)]


def test_a_chief_behind_alone_is_not_judged_here():
  clock = Clock()
  judge = stragglers.PaceJudge(3, lost_secs=5, clock=clock)
  for k in range(80):  # The chief steps, then saves a checkpoint for 30 s.
    clock.now = k * 0.5
    chief = min(k, 20)
    assert judge.look(100 + k, table([100 + chief - (k > 20), 100 + k,
                                      100 + k], [chief, k, k]),
                      {0, 1, 2}) == []


def test_one_set_aside_is_taken_back_once_its_trials_keep_pace():
  clock = Clock()
  judge = stragglers.PaceJudge(3, lost_secs=5, clock=clock)
  straggling(judge, clock, 42)  # Aside at 20.5 s, share 2/3.
  looks = []
  for k, trial in enumerate([-1, 30, 25, 19, 18]):
    clock.now = 21 + k
    looks.append(judge.look(200 + k, table([200 + k] * 3, [30 + k] * 3,
                                           [-1, -1, trial]), {1, 2}))
  # The first trial time, 30 ms, is its pace aside; taken back at 0.6 of
  # it (18 ms): at 18, not 19.
  assert looks[:4] == [[]] * 4
  assert looks[4] == [('back', 2, (18, 30))]
  assert not judge.aside


def test_one_set_aside_is_tried_again_after_a_while():
  clock = Clock()
  judge = stragglers.PaceJudge(3, lost_secs=5, clock=clock)
  straggling(judge, clock, 42)  # Aside at 20.5 s.
  clock.now = 20.5 + stragglers.PaceJudge.AGAIN_SECS - 0.5
  assert judge.look(300, table([300] * 3, [50] * 3, [-1, -1, 30]),
                    {1, 2}) == []
  clock.now = 20.5 + stragglers.PaceJudge.AGAIN_SECS
  assert judge.look(301, table([301] * 3, [51] * 3, [-1, -1, 30]),
                    {1, 2}) == [('back', 2, (60,))]


def test_one_not_yet_stepped_is_never_hung():
  clock = Clock()
  judge = stragglers.PaceJudge(3, lost_secs=5, clock=clock)
  for k in range(40):  # Worker 2 in its first step (slow) for 20 s.
    clock.now = k * 0.5
    assert judge.look(100 + k, table([100 + k, 100 + k, -1], [k, k, -1]),
                      {1, 2}) == []


def test_one_back_from_a_loss_is_judged_afresh():
  clock = Clock()
  judge = stragglers.PaceJudge(3, lost_secs=5, clock=clock)
  for k in range(4):  # Worker 2 steps, then is lost and restarted.
    clock.now = k * 0.5
    judge.look(100 + k, table([100 + k] * 3, [k] * 3), {1, 2})
  judge.forget(2)
  for k in range(4, 30):  # Its first step after the restart is slow.
    clock.now = k * 0.5
    assert judge.look(100 + k, table([100 + k, 100 + k, 103],
                                     [k, k, 3]), {1, 2}) == []
