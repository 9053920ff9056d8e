"""train_distributed.TimeLeft against a clock the test sets: the expectations are worked
by hand, and no test waits."""

import train_distributed


class Clock:
  """A clock that stands where the test puts it."""

  def __init__(self):
    self.now = 0.0

  def __call__(self):
    return self.now


def estimates(max_steps, points):
  """TimeLeft's answers to [(seconds on the clock, global step)]."""
  clock = Clock()
  left = train_distributed.TimeLeft(max_steps, clock=clock)
  answers = []
  for secs, step in points:
    clock.now = secs
    answers.append(left.update(step))
  return answers


def test_the_rate_of_the_steps_times_the_steps_left():
  # 100 steps in 10 s: 0.1 s a step; 900 steps left: 90 s.
  assert estimates(1000, [(0, 0), (10, 100)]) == ['?', '0:01:30']
  # From a resumed step: 50 steps in 20 s, 0.4 s a step; 450 left: 180 s.
  assert estimates(1000, [(100, 500), (120, 550)]) == ['?', '0:03:00']


def test_hours_minutes_and_seconds():
  # 0.1 s a step, 99,900 steps left: 9,990 s = 2 h 46 min 30 s.
  assert estimates(100000, [(0, 0), (10, 100)])[-1] == '2:46:30'
  # 0.1 s a step, 1,000,000 left: 100,000 s = 27 h 46 min 40 s (no days).
  assert estimates(1000100, [(0, 0), (10, 100)])[-1] == '27:46:40'


def test_unknown_until_the_step_and_the_clock_have_moved():
  # One point, no rate.
  assert estimates(1000, [(0, 0)]) == ['?']
  # The step has not moved (the first step still running, or waiting for
  # a worker): no rate yet.
  assert estimates(1000, [(0, 0), (10, 0), (20, 0)]) == ['?', '?', '?']
  # It moves, measured from the first point: 100 steps in 30 s; 900 left.
  assert estimates(1000, [(0, 0), (10, 0), (30, 100)])[-1] == '0:04:30'
  # The clock has not moved.
  assert estimates(1000, [(5, 0), (5, 50)]) == ['?', '?']


def test_at_or_past_max_steps_nothing_is_left():
  assert estimates(100, [(0, 90), (10, 100)])[-1] == '0:00:00'
  # Another worker's updates took the global step past max_steps.
  assert estimates(100, [(0, 90), (10, 110)])[-1] == '0:00:00'


def test_the_rate_is_that_of_the_last_window_of_points():
  assert train_distributed.TimeLeft.WINDOW == 5  # Points kept: the window's 5, and 1.
  # A slow start (10 steps in the first 100 s), then 100 steps each 10 s.
  # Each estimate is the steps left times (now - oldest point's time) /
  # (step - oldest point's step); max_steps 1510.
  assert estimates(1510, [
      (0, 0),      # ?
      (100, 10),   # 1500 left x 100 s / 10 steps = 15000 s
      (110, 110),  # 1400 x 110 / 110 = 1400 s
      (120, 210),  # 1300 x 120 / 210 = 742.9 s, 743
      (130, 310),  # 1200 x 130 / 310 = 503.2 s, 503
      (140, 410),  # 1100 x 140 / 410 = 375.6 s, 376
      # Seven points: the oldest, (0, 0), is dropped; from (100, 10):
      (150, 510),  # 1000 x 50 / 500 = 100 s
      # And (100, 10): the slow start is forgotten; from (110, 110):
      (160, 610),  # 900 x 50 / 500 = 90 s
  ]) == ['?', '4:10:00', '0:23:20', '0:12:23', '0:08:23', '0:06:16',
         '0:01:40', '0:01:30']
