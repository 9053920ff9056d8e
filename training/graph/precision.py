"""Mixed precision: what a worker computes in, what it says about it, and
float16's dynamic loss scaling.

--mixed_precision computes in bfloat16 on a CPU (oneDNN's graph rewrite)
and float16 on a GPU (TensorFlow's auto mixed precision); variables,
gradient accumulation, BatchNorm statistics and checkpoints stay float32.
float16 gradients need a loss scale (LossScaled); bfloat16's do not.
"""

import tensorflow as tf

from training.cluster.cluster_config import UsageError

tf1 = tf.compat.v1


def compute_dtype(mixed_precision, choice, num_gpus):
  """What a worker computes in: None (float32), 'bfloat16' or 'float16'.

  Args:
    mixed_precision: --mixed_precision.
    choice: --mixed_precision_dtype: 'auto' (bfloat16 on a CPU worker,
      float16 on a GPU worker), 'bfloat16' or 'float16'.
    num_gpus: --num_gpus.

  Raises:
    UsageError: for a choice without --mixed_precision, or bfloat16 on a
      GPU (TensorFlow's rewrite for GPUs computes float16).
  """
  if not mixed_precision:
    if choice != 'auto':
      raise UsageError('--mixed_precision_dtype=%s needs --mixed_precision: '
                       'add it, or drop --mixed_precision_dtype' % choice)
    return None
  if choice == 'bfloat16' and num_gpus:
    raise UsageError('--mixed_precision_dtype=bfloat16 is for CPU workers: '
                     'on a GPU TensorFlow\'s graph rewrite computes float16; '
                     'drop --mixed_precision_dtype or --num_gpus')
  if choice == 'auto':
    return 'float16' if num_gpus else 'bfloat16'
  return choice


# /proc/cpuinfo's names of the instructions oneDNN runs bfloat16 with.
BF16_FLAGS = ('avx512_bf16', 'amx_bf16')
STAY_FLOAT32 = ('variables, gradient accumulation, BatchNorm statistics and '
                'checkpoints stay float32')


def cpu_bf16_flags(cpuinfo='/proc/cpuinfo'):
  """This CPU's bfloat16 instructions (of BF16_FLAGS); None if unknown."""
  try:
    with open(cpuinfo) as f:
      flags = next((l.split(':', 1)[1].split() for l in f
                    if l.startswith('flags')), [])
  except OSError:
    return None
  return [f for f in BF16_FLAGS if f in flags]


# The compute capability below which TensorFlow's float16 rewrite leaves a
# GPU's ops alone (kMinGPUArch in auto_mixed_precision.cc; it logs that only
# at VLOG 1, so a run would say nothing).
FLOAT16_GPU = (7, 0)


def gpu_compute_capability(index):
  """(major, minor) of GPU index (session_config's visible_device_list
  numbering); None if unknown."""
  gpus = tf.config.list_physical_devices('GPU')
  if index >= len(gpus):
    return None
  details = tf.config.experimental.get_device_details(gpus[index])
  return details.get('compute_capability')


def mixed_precision_line(task_index, dtype, num_gpus):
  """What --mixed_precision turned on in a worker, for it to print: one
  line; a warning where the hardware has no use for it: a CPU without
  bfloat16 instructions of its own (slower than float32, tensorflow#42422),
  a GPU that TensorFlow's float16 rewrite skips."""
  name = 'Worker %d' % task_index
  scaling = 'dynamic loss scaling'
  if dtype == 'float16' and num_gpus:
    capability = gpu_compute_capability(task_index % num_gpus)
    if capability and capability < FLOAT16_GPU:
      return ('%s: warning: --mixed_precision on a GPU of compute capability '
              '%d.%d: TensorFlow\'s float16 rewrite needs %d.%d or more and '
              'skips it, so this run computes float32 (with %s); drop the '
              'flag' % ((name,) + capability + FLOAT16_GPU + (scaling,)))
    return ('%s: --mixed_precision: float16 compute through TensorFlow\'s '
            'auto mixed precision on the GPU, with %s; %s' % (
                name, scaling, STAY_FLOAT32))
  if dtype == 'float16':
    return ('%s: --mixed_precision: float16 compute on the CPU (TensorFlow\'s '
            'GPU rewrite on float16 CPU kernels: float16\'s numerics, no '
            'faster than float32), with %s; %s' % (name, scaling,
                                                    STAY_FLOAT32))
  found = cpu_bf16_flags()
  if found:
    return ('%s: --mixed_precision: bfloat16 compute through oneDNN\'s graph '
            'rewrite (this CPU has %s); %s' % (name, ', '.join(found),
                                                STAY_FLOAT32))
  return ('%s: warning: --mixed_precision on a CPU with %s: bfloat16 may run '
          'slower than float32 here; drop the flag' % (
              name, 'no AVX512_BF16 or AMX-BF16' if found is not None else
              'no /proc/cpuinfo to say whether it has AVX512_BF16 or AMX'))


def mixed_precision_hint(task_index, num_gpus, cpuinfo='/proc/cpuinfo'):
  """The one short line the chief of a run started without
  --mixed_precision prints on a CPU with AMX-BF16, where the flag pays most
  (docs/performance.md); None anywhere else (another worker: once a run is
  enough; a GPU worker; a CPU with AVX512_BF16 alone, where the flag is
  worth a try but gains less)."""
  if (task_index or num_gpus or
      'amx_bf16' not in (cpu_bf16_flags(cpuinfo) or ())):
    return None
  return ('Worker 0: --mixed_precision would be faster on this CPU '
          '(AMX-BF16: 1.70x images/s, accuracy unchanged)')


class LossScaled(tf1.train.Optimizer):
  """Dynamic loss scaling for float16 gradients, around SGD or momentum.

  float16 gradients of a loss this small underflow to zero, so the loss is
  multiplied by a scale before the gradients and they are divided by it
  after. A step whose gradients overflowed (inf or NaN) leaves the weights
  as they were and halves the scale; increment_period good steps in a row
  double it (the rule and defaults of TensorFlow's DynamicLossScale, whose
  TF1 class is deprecated). Two things differ from TensorFlow's
  MixedPrecisionLossScaleOptimizer, for SyncReplicasOptimizer and the ps:

  * A skipped step still advances the global step. SyncReplicasOptimizer's
    accumulators count steps themselves (each take_grad moves theirs on by
    one) and drop gradients computed at an older global step as stale: had
    the global step stayed, every worker's next gradients would have been
    dropped and the cluster would have waited forever.
  * Nothing is applied under a cond: each gradient is checked where it was
    aggregated, on its variable's ps, and replaced by zeros when any
    overflowed, and the optimizer is made for that outcome (a rate of 0,
    a momentum of 1: train_graph.optimizer), which leaves the weights and
    momentum's accumulators exactly as they were. So only one boolean per
    variable crosses between the ps tasks (checking them beside the scale
    would have moved every gradient to its ps).

  The scale and its two counts are variables on a ps, shared by the
  workers, in a collection of their own: not saved, so a checkpoint
  resumes with or without float16, and initialized by the first worker
  that starts (local_init_op), so that a worker that joins or comes back
  later does not reset them; a new cluster, with new ps tasks, starts from
  the initial scale. Each step updates them under one mutex on that ps
  (a CriticalSection with a shared_name: the same one in every worker's
  graph, and in the synchronous chief's sync op), so that no worker's
  update is lost to another's.
  """

  INITIAL = 2.0**15  # TensorFlow's DynamicLossScale's.
  INCREMENT_PERIOD = 2000
  COLLECTION = 'loss_scaling'

  def __init__(self, make_opt, initial_scale,
               increment_period=INCREMENT_PERIOD):
    """Wraps the optimizer make_opt(finite) makes.

    Args:
      make_opt: Called with None (for the gradients) or with a step's
        boolean tensor, whether its gradients were all finite; returns the
        optimizer, which must leave every variable as it was for zero
        gradients where that tensor is false.
      initial_scale: The scale to start from.
      increment_period: Good steps in a row that double the scale.
    """
    super().__init__(use_locking=False, name='LossScaled')
    self._make_opt = make_opt
    self._opt = make_opt(None)
    self._period = int(increment_period)
    self._initial = {}
    with tf1.variable_scope('loss_scaling'):
      self.scale = self._variable('scale', float(initial_scale))
      self.good_steps = self._variable('good_steps', tf.constant(0, tf.int64))
      self.skipped_steps = self._variable('skipped_steps',
                                          tf.constant(0, tf.int64))
    # One mutex on the scale's ps, the same in every worker's graph (by its
    # shared_name, in that ps's resource manager): a step's update of the
    # scale and its counts runs whole, read to write, under it.
    with tf1.colocate_with(self.scale):
      self.critical = tf.CriticalSection(name='loss_scaling_mutex',
                                         shared_name='loss_scaling_mutex')
    self.used_scale = None  # The read compute_gradients made.
    self.after = None

  def _variable(self, name, value):
    var = tf1.get_variable(name, initializer=value, trainable=False,
                           collections=[self.COLLECTION])
    self._initial[var] = value
    return var

  def local_init_op(self):
    """An op that initializes the variables that are not yet, for each
    worker's Scaffold.local_init_op."""
    return tf.group(*[tf1.cond(
        tf1.is_variable_initialized(var), tf.no_op,
        lambda var=var, value=value: var.assign(value, read_value=False))
                      for var, value in self._initial.items()])

  def reads_after(self, op):
    """[skipped steps, scale], read after op (a step's train op), together
    (under the mutex: no other worker's update between them); build()
    keeps them as .after, for hooks.SkippedStepsHook."""
    with tf.control_dependencies([op]), tf1.colocate_with(self.scale):
      return self.critical.execute(lambda: [self.skipped_steps.read_value(),
                                            self.scale.read_value()],
                                   name='loss_scale_read')

  def compute_gradients(self, loss, var_list=None, **kwargs):
    """The gradients of loss times the scale, divided by it again."""
    self.used_scale = scale = self.scale.read_value()
    grads = self._opt.compute_gradients(loss * scale, var_list, **kwargs)
    unscaled = []
    for grad, var in grads:
      if grad is not None:
        if isinstance(grad, tf.IndexedSlices):
          raise TypeError('no sparse gradients here (%s)' % var.name)
        # Where the gradient is, on the worker: it then crosses once, to
        # its variable's ps (packed there by training/graph/transfers.py).
        with tf1.colocate_with(grad):
          grad = grad * tf.math.reciprocal(scale)
      unscaled.append((grad, var))
    return unscaled

  def apply_gradients(self, grads_and_vars, global_step=None, name=None):
    """Applies the gradients, or zeros if any overflowed.

    Either way global_step advances, then the scale is updated.
    """
    grads_and_vars = [(g, v) for g, v in grads_and_vars if g is not None]
    checks = []
    for grad, var in grads_and_vars:
      with tf1.colocate_with(var):
        checks.append(tf.reduce_all(tf.math.is_finite(grad)))
    with tf1.colocate_with(self.scale):
      finite = tf.reduce_all(tf.stack(checks), name='gradients_are_finite')
    kept = []
    for grad, var in grads_and_vars:
      with tf1.colocate_with(var):
        kept.append((tf.where(finite, grad, tf.zeros_like(grad)), var))
    with tf1.colocate_with(self.scale):
      opt = self._make_opt(finite)
    applied = opt.apply_gradients(kept, global_step, name)
    with tf.control_dependencies([applied]), tf1.colocate_with(self.scale):
      return self._update_scale(finite)

  def _update_scale(self, finite):
    """DynamicLossScale's rule, under the ps's mutex. On an overflow, half
    the scale the step used, not the scale now: asynchronous workers that
    overflowed at the same scale halve it once between them, not once
    each. Without the mutex a finite step that read the scale before
    another worker halved it would write the unhalved scale back."""
    def update():
      good = tf.where(finite, self.good_steps.read_value() + 1, 0)
      grow = good >= self._period
      scale = self.scale.read_value()
      doubled = scale * 2
      new_scale = tf.where(
          finite,
          tf.where(grow & tf.math.is_finite(doubled), doubled, scale),
          tf.minimum(scale, tf.maximum(self.used_scale / 2, 1.0)))
      writes = [
          self.scale.assign(new_scale, read_value=False),
          self.good_steps.assign(
              tf.where(grow, tf.constant(0, tf.int64), good),
              read_value=False),
          self.skipped_steps.assign_add(
              tf.cast(tf.logical_not(finite), tf.int64), read_value=False)]
      with tf.control_dependencies(writes):
        return tf.identity(finite)  # execute() returns tensors, not ops.
    return tf.group(self.critical.execute(update, name='loss_scale_update'),
                    name='update_loss_scale')
