"""The training graph of a worker: where each part runs, and the model,
loss, learning rate and (synchronous) optimizer on top of the input batches.

The reference's graph, with its bugs fixed: the weight decay is in the loss,
BatchNorm statistics are updated once per global step, and the step a run
reached is read after its update.
"""

import collections

import tensorflow as tf
from tensorflow.python.ops import variables as tf_variables
from tensorflow.python.training import training_util

import cifar10_model
from training import learning_rate
from training import placement

tf1 = tf.compat.v1

DROPOUT_KEEP_PROB = 0.8  # The reference's.

# The tensors and ops a worker's session loop and hooks need.
TrainingGraph = collections.namedtuple(
    'TrainingGraph',
    'global_step loss accuracy step_after sync_opt loss_scaling '
    'learning_rate schedule')


def devices(cluster, task_index, num_gpus):
  """Returns (input device, variable device function or name).

  The input pipeline runs on this worker's CPU, the model on its GPU (with
  num_gpus > 0) or CPU, the variables on the ps tasks (or, with no cluster,
  beside the model).
  """
  compute = '/device:GPU:0' if num_gpus else '/cpu:0'
  if cluster is None:
    return '/cpu:0', compute
  worker = '/job:worker/task:%d' % task_index
  return (worker + '/cpu:0',
          placement.device_setter(cluster, worker + compute))


class Wire:
  """How a worker reads the trainable variables from the ps tasks: once
  per step each, as dtype, packed into one tensor per ps.

  Without it the worker pulls every weight twice: the layer reads it for
  its convolution and again for its L2 regularizer (measured in a traced
  step: 1,441,281 bytes for a model of 719,848). Through getter() both use
  one read on the worker. With dtype bfloat16 each variable is cast beside
  it, on its ps, and back to float32 on the worker, so the pull moves half
  the bytes again. A partitioned variable is read part by part, each from
  its own ps, and joined on the worker. BatchNorm's moving statistics (not
  trainable) stay as they are: only the ps reads and updates them.

  pack() then sends each ps's reads as one tensor: flattened and joined on
  the ps, split on the worker. Every tensor that crosses costs both ends
  CPU of its own (measured with a ps and a worker server and this model's
  12 variables, pulled and pushed 300 times: 4.2-4.8 ms of the worker's
  CPU and 3.6-4.3 of the ps's per step one tensor a variable, 2.5-2.9 and
  2.2-2.5 packed). Built with colocate_gradients_with_ops, the gradients
  take the mirror path: joined on the worker, one tensor to each ps, split
  there for each variable's update (and cast back to float32 there, with
  bfloat16).
  """

  def __init__(self, dtype):
    """Args: dtype: what the weights cross the network as."""
    self.dtype = dtype
    self._pulls = []  # (variable or part, its read on the ps, the worker's)

  def _on_the_wire(self, part):
    if self.dtype == part.dtype.base_dtype:
      return part.value()
    with tf1.colocate_with(part):
      return tf.cast(part, self.dtype)

  def _pull(self, part):
    """A part's read as the worker receives it, recorded for pack()."""
    sent = self._on_the_wire(part)
    received = tf.identity(sent)  # In the worker's device scope.
    self._pulls.append((part, sent, received))
    return received

  def getter(self, next_getter, *args, **kwargs):
    """A variable_scope custom getter: the variable as the worker reads it
    (the one read that the layer and its regularizer use)."""
    var = next_getter(*args, **kwargs)
    if not kwargs.get('trainable', True):
      return var
    if isinstance(var, tf_variables.PartitionedVariable):
      axis = next((i for i, n in enumerate(var._get_partitions()) if n > 1),  # pylint: disable=protected-access
                  0)
      received = tf.concat([self._pull(p) for p in var], axis)
    else:
      received = self._pull(var)
    return tf.identity(tf.cast(received, var.dtype.base_dtype))

  def pack(self):
    """Rewires the reads recorded so far into one tensor per ps (and
    dtype): called after the model is built, before its gradients."""
    by_ps = collections.OrderedDict()
    for part, sent, received in self._pulls:
      by_ps.setdefault((part.device, received.device, sent.dtype),
                       []).append((sent, received.op, 0))
    for (ps, worker, _), edges in by_ps.items():
      send_packed(edges, ps, worker)
    self._pulls = []


def send_packed(edges, source, dest):
  """Sends tensors from one device to another as one tensor: flattened and
  joined on source, split and reshaped on dest, where each consumer's
  input is rewired to its piece.

  Args:
    edges: [(tensor on source, the op on dest that takes it, the input
      index)], of one dtype, each tensor of a static shape.
    source, dest: The two devices.
  """
  if len(edges) < 2:
    return
  with tf1.device(source):
    packed = tf.concat([tf.reshape(t, [-1]) for t, _, _ in edges], 0,
                       name='packed')
  with tf1.device(dest):
    pieces = tf.split(packed, [t.shape.num_elements() for t, _, _ in edges])
    for piece, (tensor, op, index) in zip(pieces, edges):
      op._update_input(index, tf.reshape(piece, tensor.shape))  # pylint: disable=protected-access


def batch_norm_updates_on_ps(update_ops):
  """Moves BatchNorm's updates of its moving statistics to their ps, and
  sends them the batch statistics as one tensor per ps.

  Each update (tf-slim's assign_moving_average) is built where the layer
  is: it read the moving statistic from its ps, subtracted the batch's on
  the worker and sent the difference back, 2 transfers each, 20 a step
  for this model's 10 statistics. On the ps, only the batch statistics
  cross, packed (see send_packed): 1 transfer. The same ops, so the same
  arithmetic.

  Args:
    update_ops: The UPDATE_OPS the model made; the ones of another shape
      than assign_moving_average's are left as they are.
  """
  by_ps = collections.OrderedDict()
  for update in update_ops:
    # An op, or the _UnreadVariable a resource variable's assign_sub gives.
    update = update if isinstance(update, tf.Operation) else update.op
    if update.type != 'AssignSubVariableOp':
      continue
    handle, delta = update.inputs  # delta = (moving - batch) * decay.
    difference, decay = delta.op.inputs
    if delta.op.type != 'Mul' or difference.op.type != 'Sub':
      continue
    batch = difference.op.inputs[1]
    for op in (delta.op, difference.op, decay.op):
      op._set_device(handle.op.device)  # pylint: disable=protected-access
    by_ps.setdefault((handle.op.device, batch.device, batch.dtype),
                     []).append((batch, difference.op, 1))
  for (ps, worker, _), edges in by_ps.items():
    send_packed(edges, worker, ps)


class ColocatedAverages:
  """The weights' moving averages, each updated on the ps that holds it.

  ExponentialMovingAverage.apply builds its updates in the device scope
  it is called in: under replica_device_setter (asynchronous training)
  that is the worker, and SyncReplicasOptimizer calls it on the global
  step's ps. Either way each update read the weight and its average from
  where they live and wrote the average back: measured on 2 ps + 2
  synchronous workers, the ps tasks sent each other 1.1 MB a step, 1.5x
  the model, besides the 1.5 MB they sent the workers. Built once per ps,
  for the variables it holds, on that ps, an update reads and writes only
  what is there; what crosses is the global step, one scalar a ps, for
  the decay.
  """

  def __init__(self, averages):
    self.averages = averages

  def apply(self, var_list):
    """Returns an op that updates the average of every variable."""
    by_device = collections.OrderedDict()
    for var in var_list:
      by_device.setdefault(var.device, []).append(var)
    updates = []
    for device, variables in by_device.items():
      with tf1.device(device):
        updates.append(self.averages.apply(variables))
    return tf.group(*updates, name='moving_averages')


class LossScaled(tf1.train.Optimizer):
  """Dynamic loss scaling for float16 gradients, around plain SGD.

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
    dropped and the cluster would have waited forever (measured with
    TensorFlow's optimizer: a synchronous run stopped at its first
    overflow).
  * Nothing is applied under a cond: each gradient is checked where it was
    aggregated, on its variable's ps, and replaced by zeros when any
    overflowed, which leaves SGD's weights exactly as they were (not a
    momentum's: hence SGD only). So only one boolean per variable crosses
    between the ps tasks (checking them beside the scale would have moved
    every gradient to its ps).

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

  def __init__(self, opt, initial_scale, increment_period=INCREMENT_PERIOD):
    """Wraps opt.

    Args:
      opt: A GradientDescentOptimizer.
      initial_scale: The scale to start from.
      increment_period: Good steps in a row that double the scale.
    """
    if not isinstance(opt, tf1.train.GradientDescentOptimizer):
      raise TypeError('zeroed gradients leave only plain SGD unchanged, not '
                      '%s' % type(opt).__name__)
    super().__init__(use_locking=False, name='LossScaled')
    self._opt = opt
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
    keeps them as .after, for training_session.SkippedSteps."""
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
        # Where the gradient is: on the worker, or with bfloat16 on the
        # wire, on the ps after its cast back (see Wire).
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
    applied = self._opt.apply_gradients(kept, global_step, name)
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


def one_step_read(global_step):
  """Gives TensorFlow's hooks one plain read of the global step.

  StopAtStepHook, CheckpointSaverHook and SummarySaverHook fetch the
  global step every step, through a tensor TensorFlow makes once per graph:
  a tf.cond that checks the step is initialized, split between its ps and
  the worker (6 transfers a step in a traced step). The hooks run only in
  a session made ready, where it always is: registered first, this read
  is the one they all fetch.
  """
  if tf1.get_collection(training_util.GLOBAL_STEP_READ_KEY):
    return  # Made already (TensorFlow's hooks take the one there).
  with tf1.colocate_with(global_step):
    read = tf.identity(global_step.read_value(), name='global_step_read')
  tf1.add_to_collection(training_util.GLOBAL_STEP_READ_KEY, read)


def sync_transfers_once_per_ps():
  """Sends a synchronous worker's local step, and its "gradients taken"
  signal, once to each ps, not once per variable.

  SyncReplicasOptimizer hands each variable's accumulator the worker's
  local step (the global step its gradients were computed at, to drop
  stale ones), each through a read of its own: 12 scalars from the worker
  to the ps every step. The step is only assigned after every accumulator
  took its gradient, so one read, received once by each ps, is the same.
  And the worker's token is dequeued (on the global step's ps) after
  every accumulator took its gradient: a control edge from each, one
  transfer each from another ps. One group per ps is the same wait.
  """
  graph = tf1.get_default_graph()
  sent = {}
  for op in graph.get_operations():
    if op.type in ('ResourceAccumulatorApplyGradient',
                   'AccumulatorApplyGradient'):
      step = op.inputs[1]  # handle, local_step, gradient
      if op.device not in sent:
        with tf1.device(op.device):
          sent[op.device] = tf.identity(step, name='local_step_on_ps')
      op._update_input(1, sent[op.device])  # pylint: disable=protected-access
    elif op.type == 'QueueDequeueV2' and op.name.endswith('sync_token_q_Dequeue'):
      by_device = collections.OrderedDict()
      for dep in op.control_inputs:
        by_device.setdefault(dep.device, []).append(dep)
      groups = []
      for device, deps in by_device.items():
        with tf1.device(device):
          groups.append(tf.group(*deps, name='gradients_taken'))
      op._remove_all_control_inputs()  # pylint: disable=protected-access
      op._add_control_inputs(groups)  # pylint: disable=protected-access


def scaffold(graph):
  """The Scaffold a worker's session is made from.

  With SyncReplicasOptimizer, its own readiness check (every global
  variable exists) before the local init; with float16, the loss scaling's
  initializer (LossScaled.local_init_op) after the default local init.
  """
  local_init = tf1.train.Scaffold.default_local_init_op()
  if graph.loss_scaling:
    local_init = tf.group(local_init, graph.loss_scaling.local_init_op())
  return tf1.train.Scaffold(
      ready_for_local_init_op=(graph.sync_opt.ready_for_local_init_op
                               if graph.sync_opt else None),
      local_init_op=local_init)


def optimize(loss, lr, global_step, sync, colocate, loss_scale=None,
             loss_scale_period=LossScaled.INCREMENT_PERIOD):
  """SGD on loss, then the weights' moving averages.

  Args:
    loss, lr, global_step: The loss, learning rate and global step.
    sync: (replicas_to_aggregate, total workers), or None.
    colocate: colocate_gradients_with_ops, for Wire's packing and casts.
    loss_scale: The initial scale of float16's dynamic loss scaling (see
      LossScaled); None for none.
    loss_scale_period: Its good steps in a row that double the scale.

  Returns:
    (the optimizer, the op that runs one update, the LossScaled or None),
    the optimizer a SyncReplicasOptimizer with sync.
  """
  opt = tf1.train.GradientDescentOptimizer(lr)
  scaled = None
  if loss_scale:
    opt = scaled = LossScaled(opt, loss_scale, loss_scale_period)
  averages = ColocatedAverages(cifar10_model.moving_averages(global_step))
  if not sync:
    with tf.control_dependencies([opt.minimize(
        loss, global_step=global_step, colocate_gradients_with_ops=colocate)]):
      return opt, averages.apply(tf1.trainable_variables()), scaled
  # The chief's sync op updates the averages once per global step, after it
  # applied the aggregated gradients.
  opt = tf1.train.SyncReplicasOptimizer(
      opt, replicas_to_aggregate=sync[0], total_num_replicas=sync[1],
      variable_averages=averages,
      variables_to_average=tf1.trainable_variables(),
      name='cifar10_sync_replicas')
  return opt, opt.minimize(loss, global_step=global_step,
                           colocate_gradients_with_ops=colocate), scaled


def model(images, num_ps, transfer_dtype, num_classes):
  """The model's logits, its variables spread over num_ps ps tasks (0:
  none) and read through a Wire of transfer_dtype (None: no network)."""
  wire = Wire(transfer_dtype) if transfer_dtype else None
  with tf1.variable_scope('', partitioner=placement.partitioner(num_ps),
                          custom_getter=wire.getter if wire else None):
    logits = cifar10_model.inference(images, is_training=True,
                                     dropout_keep_prob=DROPOUT_KEEP_PROB,
                                     num_class=num_classes)
  if wire:
    wire.pack()
  return logits


def statistics_updates(is_chief, sync, over_network):
  """The BatchNorm moving statistics' updates a worker's step runs.

  One update per global step, as in a single process: from each step of an
  asynchronous worker, and in synchronous training from the chief only
  (the others' updates would land on the ps unaggregated, N times per
  global step). Over a network, made on the ps (batch_norm_updates_on_ps).
  """
  if sync and not is_chief:
    return []
  update_ops = tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)
  if over_network:
    batch_norm_updates_on_ps(update_ops)
  return update_ops


def build(images, labels, num_ps, is_chief, schedule, sync=None,
          transfer_dtype=None, loss_scale=None,
          loss_scale_period=LossScaled.INCREMENT_PERIOD,
          num_classes=cifar10_model.NUM_CLASSES):
  """Builds the model, loss and train op in the current device scope.

  Args:
    images, labels: A training batch.
    num_ps: The ps tasks the variables are spread over (0: none).
    is_chief: Whether this is worker 0.
    schedule: The learning rate's learning_rate.Schedule.
    sync: (replicas_to_aggregate, total workers) for SyncReplicasOptimizer;
      None for asynchronous training or one process.
    transfer_dtype: What the weights and their gradients cross the network
      as, between the ps tasks and this worker (see Wire); None
      without a network (one process).
    loss_scale: The initial loss scale, for float16 compute; None for none.
    loss_scale_period: Good steps in a row that double the loss scale.
    num_classes: The logits' size: the data's classes.

  Returns:
    A TrainingGraph. Running step_after runs one training step.
  """
  global_step = tf1.train.get_or_create_global_step()
  one_step_read(global_step)
  logits = model(images, num_ps, transfer_dtype, num_classes)
  loss = cifar10_model.loss(logits, labels)
  accuracy = tf.reduce_mean(tf.cast(
      tf1.nn.in_top_k(logits, labels, 1), tf.float32), name='batch_accuracy')
  lr = learning_rate.rate(schedule, global_step)
  opt, minimize, scaled = optimize(
      loss, lr, global_step, sync,
      colocate=transfer_dtype is not None,
      loss_scale=loss_scale, loss_scale_period=loss_scale_period)
  if sync and transfer_dtype:
    sync_transfers_once_per_ps()
  train_op = tf.group(minimize, *statistics_updates(
      is_chief, sync, transfer_dtype is not None), name='train_op')
  with tf.control_dependencies([train_op]):
    # The step this training step reached: read after it, not beside it.
    step_after = global_step.read_value()
  if scaled:
    scaled.after = scaled.reads_after(train_op)
  tf1.summary.scalar('loss', loss)
  # Not the op's name: a summary named like an op gets a suffix (accuracy_1).
  tf1.summary.scalar('accuracy', accuracy)
  tf1.summary.scalar('learning_rate', lr)
  if scaled:
    tf1.summary.scalar('loss_scale', scaled.scale.read_value())
  return TrainingGraph(global_step, loss, accuracy, step_after,
                       opt if sync else None, scaled, lr, schedule)
