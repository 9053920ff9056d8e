"""The learning rate's schedules and scaling: the graph's values at chosen
steps against numbers worked out by hand."""

import pytest
import tensorflow as tf

from training.graph import learning_rate
from training.storage import records

tf1 = tf.compat.v1


def rates(schedule, steps):
  """The graph's learning rate at each global step."""
  with tf.Graph().as_default():
    step = tf1.placeholder(tf.int64, [])
    rate = learning_rate.rate(schedule, step)
    with tf1.Session() as sess:
      return [sess.run(rate, {step: s}) for s in steps]


def schedule(kind, examples=128, scaling='none', warmup=0, max_steps=100,
             decay_steps=10, factor=0.5):
  return learning_rate.Schedule(kind, 0.1, examples, scaling, warmup,
                                max_steps, decay_steps, factor)


def test_exponential_is_the_reference_staircase():
  # 0.1 x 0.5^floor(step / 10).
  assert rates(schedule('exponential'), [0, 9, 10, 19, 25, 99]) == (
      pytest.approx([0.1, 0.1, 0.05, 0.05, 0.025, 0.1 * 0.5 ** 9]))


def test_the_reference_flags_train_at_the_initial_rate_throughout():
  # --num_epochs_per_decay=350 on 50,000 records of batches of 128: a decay
  # every 136,718 steps.
  steps = learning_rate.decay_steps(50000, 128, 350)
  assert steps == 136718
  assert rates(schedule('exponential', decay_steps=steps, factor=0.1),
               [0, 5000, 136717, 136718]) == pytest.approx(
                   [0.1, 0.1, 0.1, 0.01])


def test_cosine_falls_to_zero_at_max_steps():
  # 0.1 x (1 + cos(pi x step / 100)) / 2; cos(pi/4) = 0.70710678.
  assert rates(schedule('cosine'), [0, 25, 50, 75, 100, 150]) == (
      pytest.approx([0.1, 0.085355339, 0.05, 0.014644661, 0.0, 0.0],
                    abs=1e-7))


def test_warmup_ramps_linearly_then_the_schedule_starts():
  # 10 steps of warmup: 0.1 x (step + 1) / 10; then cosine over steps
  # 10..110.
  got = rates(schedule('cosine', warmup=10, max_steps=110),
              [0, 4, 9, 10, 60, 110])
  assert got == pytest.approx([0.01, 0.05, 0.1, 0.1, 0.05, 0.0], abs=1e-7)
  # The exponential schedule counts its decays from step 0, warmup or not.
  assert rates(schedule('exponential', warmup=10), [0, 9, 10, 20]) == (
      pytest.approx([0.01, 0.1, 0.05, 0.025]))


@pytest.mark.parametrize('examples, scaling, top', [
    (128, 'linear', 0.1), (256, 'linear', 0.2), (32, 'linear', 0.025),
    (1024, 'linear', 0.8), (1024, 'none', 0.1)])
def test_linear_scaling_is_examples_per_update_over_128(examples, scaling,
                                                         top):
  # Cosine: top at step 0, half of it halfway (step 50 of 100).
  assert rates(schedule('cosine', examples, scaling), [0, 50]) == (
      pytest.approx([top, top / 2]))
  # Exponential: top, then halved every 10 steps from it.
  assert rates(schedule('exponential', examples, scaling), [0, 9, 10, 25]) == (
      pytest.approx([top, top, top / 2, top / 4]))


def test_warmup_ramps_up_to_the_scaled_rate():
  # 256 examples an update, linear: the peak is 0.2, and the 10 warmup
  # steps climb to it, 0.2 x (step + 1) / 10; then cosine over 10..110.
  got = rates(schedule('cosine', 256, 'linear', warmup=10, max_steps=110),
              [0, 4, 9, 10, 60, 110])
  assert got == pytest.approx([0.02, 0.1, 0.2, 0.2, 0.1, 0.0], abs=1e-7)


def test_the_chief_says_where_the_rate_comes_from():
  assert learning_rate.describe(schedule('cosine', 256, 'linear', 0, 4700)) \
      == ('cosine from 0.2 (0.1 x 256/128 examples per update, '
          '--lr_scaling=linear) to 0 at step 4700, with no warmup (a rate '
          'scaled up usually needs --warmup_steps)')
  assert learning_rate.describe(schedule('cosine', 256, 'linear', 234, 4700)) \
      == ('cosine from 0.2 (0.1 x 256/128 examples per update, '
          '--lr_scaling=linear) to 0 at step 4700, after a linear warmup of '
          '234 steps')
  # Not scaled, or scaled down (32 examples an update): none to suggest.
  assert learning_rate.describe(schedule('cosine', 256, 'none', 0, 4700)) \
      == 'cosine from 0.1 to 0 at step 4700'
  assert learning_rate.describe(schedule('cosine', 32, 'linear', 0, 4700)) \
      == ('cosine from 0.025 (0.1 x 32/128 examples per update, '
          '--lr_scaling=linear) to 0 at step 4700')
  assert learning_rate.describe(schedule('exponential', 256, 'none', 50)) \
      == ('exponential from 0.1, x0.5 every 10 steps, after a linear warmup '
          'of 50 steps')
  # Linear scaling at the reference's 128 examples: nothing to explain.
  assert learning_rate.describe(schedule('cosine', 128, 'linear')) == (
      'cosine from 0.1 to 0 at step 100')


def test_changes_name_the_flags_that_differ():
  now = schedule('cosine', 256, 'linear', max_steps=4700)
  assert learning_rate.changes(now._asdict(), now) == []
  before = dict(now._asdict(), max_steps=2000, initial=0.05)
  assert learning_rate.changes(before, now) == [
      '--initial_learning_rate 0.05 -> 0.1', '--max_steps 2000 -> 4700']
  # An earlier release: only what it is known to have had.
  assert learning_rate.changes(records.EARLIER_SCHEDULE, now) == [
      '--lr_schedule exponential -> cosine', '--lr_scaling none -> linear']
  assert learning_rate.changes(records.EARLIER_SCHEDULE,
                               schedule('exponential', 999)) == []


def test_changes_leave_out_what_the_rate_does_not_depend_on():
  # A longer exponential run keeps its rate: no change to speak of (issue
  # 44: the README's resume with a larger --max_steps warned).
  exponential = schedule('exponential', max_steps=400)
  longer = dict(exponential._asdict(), max_steps=500)
  assert learning_rate.changes(longer, exponential) == []
  # A cosine's rate depends on --max_steps, not on the decay's fields.
  cosine = schedule('cosine', max_steps=500)
  assert learning_rate.changes(dict(cosine._asdict(), max_steps=400,
                                    decay_steps=99, decay_factor=0.2),
                               cosine) == ['--max_steps 400 -> 500']
  # Examples per update count when the rate is scaled with them; otherwise
  # only the decay steps they move do.
  assert learning_rate.changes(
      dict(exponential._asdict(), examples_per_update=256,
           decay_steps=5), exponential) == ['decay steps 5 -> 10']
  scaled = schedule('exponential', 128, 'linear')
  assert learning_rate.changes(dict(scaled._asdict(), examples_per_update=256),
                               scaled) == ['examples per update 256 -> 128']
  # Another kind: what either schedule depends on.
  assert learning_rate.changes(dict(cosine._asdict(), kind='exponential',
                                    max_steps=400), cosine) == [
                                        '--lr_schedule exponential -> cosine',
                                        '--max_steps 400 -> 500']
