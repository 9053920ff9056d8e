"""The protocol the tasks speak through queues on the ps tasks, in one room.

SyncReplicasOptimizer's token queue and gradient accumulators, by the
shared names it gives them; the join queues (a worker says on ps 0 that it
joined) and the done queues (a worker tells each ps it is done). This is
the only module that names them: each is built once per graph, and the
others get functions (sizes, refill, done, close).
"""

import collections
import weakref

import tensorflow as tf

from training.graph import ps_gradients

tf1 = tf.compat.v1

# SyncReplicasOptimizer's names (TensorFlow's sync_replicas_optimizer.py):
# its token queue, and each variable's accumulator, var.name + this.
TOKEN_QUEUE = 'sync_token_q'
ACCUMULATOR_SUFFIX = '/grad_accum'

# {graph: {what: its ops}}: each queue once per graph.
_BUILT = weakref.WeakKeyDictionary()


def _once(key, build):
  """build()'s result, made once per default graph."""
  built = _BUILT.setdefault(tf1.get_default_graph(), {})
  if key not in built:
    built[key] = build()
  return built[key]


def is_token_dequeue(op):
  """Whether op is a synchronous worker's dequeue of its token."""
  return (op.type == 'QueueDequeueV2' and
          op.name.endswith(TOKEN_QUEUE + '_Dequeue'))


def token_dequeue(graph=None):
  """The synchronous worker's dequeue of its token in graph (default: the
  default graph)."""
  graph = graph or tf1.get_default_graph()
  return next(op for op in graph.get_operations() if is_token_dequeue(op))


def token_queue(global_step):
  """SyncReplicasOptimizer's token queue, beside the global step."""
  def build():
    with tf1.device(global_step.device):
      return tf1.FIFOQueue(-1, global_step.dtype.base_dtype, shapes=(),
                           shared_name=TOKEN_QUEUE, name='tokens')
  return _once('tokens', build)


def refill_token(global_step):
  """An op that puts one token, at the global step, in the token queue."""
  return _once('refill', lambda: token_queue(global_step).enqueue(
      global_step.read_value()))


def close_tokens(global_step):
  """An op that closes the token queue: workers waiting for a token stop."""
  return token_queue(global_step).close(cancel_pending_enqueues=True)


def fewest_gradients():
  """A tensor: the fewest gradients any ps's accumulators hold now (each
  ps's first accumulator stands for that ps's). With the packing, one
  accumulator a ps (ps_gradients.PsVariables); else one a variable."""
  def build():
    joined = any(op.type.endswith('ConditionalAccumulator') and
                 op.get_attr('shared_name').startswith(b'ps_gradients_')
                 for op in tf1.get_default_graph().get_operations())
    stand_ins = tf1.trainable_variables()
    stand_ins = ps_gradients.by_ps(stand_ins) if joined else stand_ins
    counts = collections.OrderedDict()
    for var in stand_ins:
      if var.device not in counts:
        with tf1.device(var.device):
          counts[var.device] = tf1.ConditionalAccumulator(
              tf.float32, shape=var.get_shape(),
              shared_name=var.name + ACCUMULATOR_SUFFIX,
              name='gradients').num_accumulated()
    return tf.reduce_min(list(counts.values()))
  return _once('gradients', build)


# SyncReplicasOptimizer's local variable: the global step a worker's next
# gradient is for (the value of the token it took).
LOCAL_STEP = 'sync_rep_local_step'

# What the progress table on the global step's ps holds for worker i: the
# local step of its last gradient applied, its steps so far, whether the
# chief set it aside (1) and how long its last trial step took (ms).
APPLIED, STEPS, ASIDE, TRIAL_MS = 0, 1, 2, 3
KINDS = 4


def _key(kind, worker):
  return kind * 1000000 + worker


def local_step():
  """SyncReplicasOptimizer's local step variable of this worker's graph."""
  return next(v for v in tf1.local_variables()
              if v.op.name.endswith(LOCAL_STEP))


def progress_table(global_step):
  """A table on the global step's ps: each worker's progress (see APPLIED).

  Not a variable: it is in no checkpoint and needs no initialization, and
  every worker's graph names the same one (its shared name).
  """
  def build():
    # Placed here, not by replica_device_setter (which places tables too).
    with tf1.device(None), tf1.device(global_step.device):
      return tf.raw_ops.MutableHashTableV2(
          shared_name='worker_progress', use_node_name_sharing=False,
          key_dtype=tf.int64, value_dtype=tf.int64, name='worker_progress')
  return _once('progress', build)


def _lookup(table, keys, name=None, default=None):
  """The table's values at keys (-1, or default: none)."""
  return tf.raw_ops.LookupTableFindV2(
      table_handle=table, keys=keys, name=name,
      default_value=tf.constant(-1, tf.int64) if default is None else default)


def _insert(table, keys, values):
  return tf.raw_ops.LookupTableInsertV2(table_handle=table, keys=keys,
                                        values=values)


def mark_progress(global_step, worker):
  """An op, run in each synchronous training step once its gradients are
  applied (when the token dequeue may run): records the local step they
  were for and counts the step, on the global step's ps."""
  after = token_dequeue().control_inputs
  table = progress_table(global_step)
  # The local step the accumulators took (their input 1): the same read,
  # so that the packing sends it once.
  applied = next((op.inputs[1] for op in after if op.type in (
      'AccumulatorApplyGradient', 'ResourceAccumulatorApplyGradient')), None)
  if applied is None:
    applied = local_step().value()
  with tf1.device(global_step.device):  # All on the ps but that read.
    applied = tf.cast(tf.reshape(applied, [1]), tf.int64)
    keys = tf.constant([_key(APPLIED, worker), _key(STEPS, worker)],
                       tf.int64)
    step_key = tf.constant([_key(STEPS, worker)], tf.int64)
    none = tf.constant(-1, tf.int64)  # Made here: in the scope, it would wait.
    with tf.control_dependencies(after):
      steps = _lookup(table, step_key, name='progress_mark', default=none)
    return _insert(table, keys, tf.concat([applied, tf.maximum(steps, 0) + 1],
                                          0))


def is_progress_mark(op):
  """Whether op is the one of mark_progress() that waits for the applies."""
  return op.type == 'LookupTableFindV2' and 'progress_mark' in op.name


def aside_flag(global_step, worker):
  """A tensor: 1 while the chief has set worker aside, else 0 or -1."""
  def build():
    with tf1.device(global_step.device):
      return _lookup(progress_table(global_step), tf.constant(
          [_key(ASIDE, worker)], tf.int64))[0]
  return _once('aside_%d' % worker, build)


def step_end(global_step, worker):
  """What a synchronous worker's step reads back from the global step's ps,
  as one tensor once it has its token: the token, the global step then,
  and its aside flag. Returns the first two, split on this worker (the
  flag is aside_seen()'s)."""
  dequeue = token_dequeue()
  with tf1.device(None), tf1.device(global_step.device):
    with tf.control_dependencies([dequeue]):
      after = global_step.read_value()
    state = tf.stack([dequeue.outputs[0], after,
                      aside_flag(global_step, worker)], name='step_end')
  token, step, aside = tf.unstack(state)
  _once('aside_seen_%d' % worker, lambda: aside)
  return token, step


def is_step_end(op):
  """Whether op is step_end()'s tensor, on the global step's ps."""
  return op.type == 'Pack' and op.name.split('/')[-1].startswith('step_end')


def aside_seen(global_step, worker):
  """A tensor to fetch with each training step: 1 once the chief has set
  worker aside. Where step_end() built the step, the step's own read back
  (no RPC of its own); else a read of the table."""
  return _once('aside_seen_%d' % worker,
               lambda: aside_flag(global_step, worker))


def read_progress(global_step, num_workers):
  """A tensor [KINDS, num_workers]: the table's values (-1: none yet)."""
  def build():
    keys = [_key(kind, i) for kind in range(KINDS)
            for i in range(num_workers)]
    with tf1.device(global_step.device):
      return tf.reshape(_lookup(progress_table(global_step), tf.constant(
          keys, tf.int64)), [KINDS, num_workers])
  return _once('read_progress', build)


def watch_reads(global_step, num_workers):
  """What the chief's watch reads, as one tensor from the global step's ps
  (one transfer, not one a value): the token queue's size, the fewest
  gradients a ps holds, the global step, the progress table. split_watch()
  gives them back."""
  def build():
    with tf1.device(None), tf1.device(global_step.device):
      return tf.concat([tf.cast(tf.stack([
          token_queue(global_step).size(), fewest_gradients()]), tf.int64),
                        tf.reshape(global_step.read_value(), [1]),
                        tf.reshape(read_progress(global_step, num_workers),
                                   [-1])], 0, name='watch_reads')
  return _once('watch_reads', build)


def split_watch(values, num_workers):
  """watch_reads()' value as its 3 numbers and the [KINDS, workers] table."""
  return [int(values[0]), int(values[1]), int(values[2]),
          values[3:].reshape([KINDS, num_workers])]


def set_value(global_step, kind, worker):
  """(a placeholder for the value, the op that writes it for worker)."""
  def build():
    value = tf1.placeholder(tf.int64, [])
    with tf1.device(global_step.device):
      write = _insert(progress_table(global_step), tf.constant(
          [_key(kind, worker)], tf.int64), tf.reshape(value, [1]))
    return value, write
  return _once('set_%d_%d' % (kind, worker), build)


def set_aside(global_step, worker):
  """(a placeholder for 1 or 0, the op that marks worker set aside or taken
  back, its trial time cleared)."""
  def build():
    value = tf1.placeholder(tf.int64, [])
    with tf1.device(global_step.device):
      write = _insert(progress_table(global_step), tf.constant(
          [_key(ASIDE, worker), _key(TRIAL_MS, worker)], tf.int64),
                      tf.stack([value, tf.constant(-1, tf.int64)]))
    return value, write
  return _once('aside_mark_%d' % worker, build)


def give_back_own_token(global_step):
  """An op: this worker, set aside, puts back the token it holds (the
  global step its next gradient was for), so that another makes it."""
  return _once('give_back', lambda: token_queue(global_step).enqueue(
      local_step().read_value()))


def take_token(global_step):
  """An op: this worker, taken back, waits for a token and holds it, and
  the weights after that token's update (its next step's)."""
  def build():
    take = local_step().assign(token_queue(global_step).dequeue())
    return tf.group(take, ps_gradients.fill_pulled_weights(after=[take]))
  return _once('take', build)


def join_queues(num_workers):
  """A one-slot queue per worker on ps 0, filled once the worker joined.

  On ps 0, not on the chief: a restarted chief still sees who is there.
  """
  def build():
    with tf.device('/job:ps/task:0/cpu:0'):
      return [tf1.FIFOQueue(1, tf.int32, shapes=[],
                            shared_name='joined_%d' % i, name='joined_%d' % i)
              for i in range(num_workers)]
  return _once('joined', build)


def joined_sizes(num_workers):
  """Tensors: for each worker, 1 once it joined, else 0."""
  return _once('joined_sizes', lambda: [q.size() for q in join_queues(
      num_workers)])


def post_joined(num_workers, task_index):
  """An op: worker task_index says it joined."""
  return join_queues(num_workers)[task_index].enqueue(task_index)


def done_queue(ps_index):
  """The queue on a ps task where each worker posts its index when done."""
  def build():
    with tf.device('/job:ps/task:%d/cpu:0' % ps_index):
      return tf1.FIFOQueue(-1, tf.int32, shapes=[],
                           shared_name='done_queue_%d' % ps_index,
                           name='done_queue_%d' % ps_index)
  return _once('done_%d' % ps_index, build)
