"""What earlier releases of the suite wrote in --train_dir that this one
still reads, and how.

  * A checkpoint without the moving averages of the weights (the releases
    before they were kept): the chief resumes it, each average starting
    from its weight (partial_restore.Rebuild; checkpoints.resume_point
    accepts it when told which variables can be rebuilt). The evaluator
    tests its weights as they are (cifar10_eval.has_averages).
  * More checkpoints than the Saver keeps (a release that forgot them at
    each restart): checkpoints.keep_newest deletes the oldest after the
    next save.
  * No data.json: the chief says so (no_data_record) and writes it.
  * No learning_rate.json: the run trained with the reference's schedule
    (SCHEDULE); the chief says what changes and the flags that keep it
    (learning_rate.changes, SCHEDULE_SAID, SCHEDULE_FLAGS).

The release before the redesign (commit 1018504) saved every variable as
this one does (tests/test_release_checkpoint.py).
"""

def no_data_record(train_dir):
  """What the chief adds to the line on its data when the train_dir it
  resumes has no data.json."""
  return ('; %s did not say what it was trained on before (an earlier '
          'release)' % train_dir)


# The learning rate of the releases before --lr_schedule, in Schedule's
# fields (their other values are not known: they were the run's flags).
SCHEDULE = {'kind': 'exponential', 'scaling': 'none', 'warmup_steps': 0}
SCHEDULE_SAID = ('the learning rate of an earlier release (the reference\'s '
                 'exponential schedule, unscaled, no warmup)')
SCHEDULE_FLAGS = ('--lr_schedule=%(kind)s --lr_scaling=%(scaling)s '
                  '--warmup_steps=%(warmup_steps)d' % SCHEDULE)
