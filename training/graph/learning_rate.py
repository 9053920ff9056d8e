"""The learning rate: its schedule over the run, and its scaling with what
one update of the weights aggregates.

Two schedules, each after an optional linear warmup:
  * exponential (the default): the reference's, `initial x
    factor^floor(step / decay steps)`. Its decay steps come from
    --num_epochs_per_decay (350 epochs, the reference's value), so a run
    shorter than that trains at the initial rate from its first step to its
    last: exactly the reference's behaviour.
  * cosine: from the initial rate down to 0 at --max_steps, half a cosine
    wave (Loshchilov and Hutter 2017); a schedule that fits the run's
    length, whatever it is.

The rate is a function of the global step alone, so a resumed run goes on
with the schedule where it left it (with the same flags).

The defaults stay the reference's (exponential, unscaled, no warmup), chosen
on three datasets (docs/accuracy.md): cosine gains on
Fashion-MNIST in 20 epochs, but a short run that spends its first hundred
steps finding its way (the 400-step quickstart) learns less with a rate that
falls meanwhile; linear scaling needs a warmup (without one the quickstart
at 0.2 learned nothing in its first 150 steps), and no number of steps fits
every dataset and run length.

Scaling (Goyal et al. 2017, "Accurate, Large Minibatch SGD"): with
`linear`, --initial_learning_rate is the rate for the reference's batch of
128 examples, and an update that aggregates B examples uses B / 128 times
it. A synchronous update aggregates --replicas_to_aggregate batches (the
backup workers' are dropped, not aggregated); an asynchronous one, a single
worker's batch.
"""

import collections
import math

import tensorflow as tf


tf1 = tf.compat.v1

REFERENCE_BATCH = 128  # The reference's --batch_size, which 0.1 is for.
SCHEDULES = ('exponential', 'cosine')
SCALINGS = ('linear', 'none')

# initial: --initial_learning_rate; examples_per_update: what one update of
# the weights aggregates; scaling: one of SCALINGS; decay_steps and
# decay_factor: the exponential schedule's.
Schedule = collections.namedtuple(
    'Schedule', 'kind initial examples_per_update scaling warmup_steps '
    'max_steps decay_steps decay_factor')


def decay_steps(num_train_records, examples_per_step, num_epochs_per_decay):
  """Global steps between exponential decays, counting real examples.

  In synchronous training a global step consumes replicas_to_aggregate
  batches; in asynchronous training, one.
  """
  steps_per_epoch = num_train_records / float(examples_per_step)
  return max(1, int(steps_per_epoch * num_epochs_per_decay))


def peak(schedule):
  """The rate after warmup: the initial one, scaled for the examples one
  update aggregates when the scaling is 'linear'."""
  if schedule.scaling == 'linear':
    return (schedule.initial * schedule.examples_per_update /
            float(REFERENCE_BATCH))
  return schedule.initial


def rate(schedule, global_step):
  """The learning rate at global_step (a tensor), as a float32 tensor."""
  step = tf.cast(global_step, tf.float32)
  if schedule.kind == 'exponential':
    decayed = tf1.train.exponential_decay(
        peak(schedule), global_step, schedule.decay_steps,
        schedule.decay_factor, staircase=True)
  else:
    span = float(max(1, schedule.max_steps - schedule.warmup_steps))
    done = tf.clip_by_value((step - schedule.warmup_steps) / span, 0., 1.)
    decayed = peak(schedule) * 0.5 * (1. + tf.cos(math.pi * done))
  if schedule.warmup_steps <= 0:
    return decayed
  # (step + 1) / warmup: the first step already trains a little.
  return decayed * tf.minimum(1., (step + 1.) / schedule.warmup_steps)


def describe(schedule):
  """What the chief says of the schedule: `cosine from 0.2 (0.1 x 256/128
  examples per update, --lr_scaling=linear) to 0 at step 4700`."""
  top = '%.4g' % peak(schedule)
  if (schedule.scaling == 'linear' and
      schedule.examples_per_update != REFERENCE_BATCH):
    top += ' (%.4g x %d/%d examples per update, --lr_scaling=linear)' % (
        schedule.initial, schedule.examples_per_update, REFERENCE_BATCH)
  if schedule.kind == 'exponential':
    text = 'exponential from %s, x%g every %d steps' % (
        top, schedule.decay_factor, schedule.decay_steps)
  else:
    text = 'cosine from %s to 0 at step %d' % (top, schedule.max_steps)
  if schedule.warmup_steps > 0:
    text += ', after a linear warmup of %d steps' % schedule.warmup_steps
  elif peak(schedule) > schedule.initial:
    # Goyal et al. ramp a scaled-up rate over 5 epochs: from step 0 it can
    # diverge, or stall (the quickstart at 0.2: nothing learnt in 150 steps).
    text += ', with no warmup (a rate scaled up usually needs --warmup_steps)'
  return text


# What a schedule field is called on the command line, for the lines that
# say what changed.
FIELD_NAMES = {'kind': '--lr_schedule', 'initial': '--initial_learning_rate',
               'examples_per_update': 'examples per update',
               'scaling': '--lr_scaling', 'warmup_steps': '--warmup_steps',
               'max_steps': '--max_steps', 'decay_steps': 'decay steps',
               'decay_factor': '--learning_rate_decay_factor'}


def depends_on(kind, scaling):
  """The fields a schedule's rate depends on: --max_steps moves a cosine,
  not an exponential one; the decay's steps and factor the reverse; the
  examples per update count only when the rate is scaled with them."""
  fields = {'kind', 'initial', 'scaling', 'warmup_steps'}
  fields |= ({'decay_steps', 'decay_factor'} if kind == 'exponential' else
             {'max_steps'})
  if scaling == 'linear':
    fields.add('examples_per_update')
  return fields


def changes(before, schedule):
  """What differs between a recorded schedule (a dict of Schedule's fields,
  or those known of an earlier release's) and this one, among the fields
  either rate depends on: ['--max_steps 4700 -> 9400', ...], in Schedule's
  order. A longer run of the exponential schedule changes nothing."""
  now = schedule._asdict()
  matter = depends_on(now['kind'], now['scaling']) | depends_on(
      before.get('kind'), before.get('scaling'))
  return ['%s %s -> %s' % (FIELD_NAMES[name], before[name], now[name])
          for name in Schedule._fields
          if name in matter and name in before and before[name] != now[name]]
