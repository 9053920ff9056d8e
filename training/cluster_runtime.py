"""The cluster at run time: session configs, gRPC servers, the ps task's
life, how the workers tell the ps tasks they joined and are done, and what
a task says while it waits for another.

The reference's ps blocked in server.join() forever and every process
grabbed every GPU and core. Here a ps serves until each worker has posted to
its done queue, then exits 0; each task sees only the devices it should use.
A task that waits for another (a ps not started, a chief that has not
initialized the model, a worker that never joined or never finished) says
which one, in one line, after WAIT_REPORT_SECS and every WAIT_REPEAT_SECS.
"""

import os
import socket
import sys
import threading
import time

import tensorflow as tf

from training import checkpoints
from training.cluster_config import UsageError

tf1 = tf.compat.v1

# TensorFlow's own "CreateSession still waiting" note (an INFO line, hidden)
# comes every 10 s; ours too, and then less often (--wait_report_secs).
WAIT_REPORT_SECS = 10
WAIT_REPEAT_SECS = 20


def report_waits_after(secs):
  """A wait is named after secs, then every 2 x secs."""
  global WAIT_REPORT_SECS, WAIT_REPEAT_SECS
  WAIT_REPORT_SECS, WAIT_REPEAT_SECS = secs, 2 * secs


def intra_op_threads(worker_hosts, task_index):
  """Returns the intra-op threads for a worker: its share of the cores.

  Every TensorFlow process sizes its op thread pool to all the cores. Two
  workers on a 2-core machine then run 4 compute threads that preempt each
  other: measured, 1 ps + 2 workers reached 0.82x the images/s of one
  process with 2 threads each and 0.99x with 1 thread each.
  """
  host = worker_hosts[task_index].rpartition(':')[0]
  on_host = sum(1 for h in worker_hosts if h.rpartition(':')[0] == host)
  return max(1, len(os.sched_getaffinity(0)) // on_host)


def session_config(job_name, task_index, worker_hosts=None, num_gpus=0,
                   threads=0, log_device_placement=False,
                   compute_dtype=None):
  """Returns the ConfigProto for this task's server and sessions.

  A ps task and every task of a num_gpus=0 run hide the GPUs, so they never
  allocate GPU memory. A worker sees only its own GPU, task_index % num_gpus,
  and grows its memory as needed, so that workers can share a card.
  Device filters keep a worker from waiting on, or talking to, other workers.

  Args:
    job_name: 'ps' or 'worker'.
    task_index: This task's index.
    worker_hosts: The workers of the cluster; None for a single process.
    num_gpus: --num_gpus.
    threads: A worker's intra-op threads; 0: intra_op_threads().
    log_device_placement: --log_device_placement.
    compute_dtype: What --mixed_precision computes in (see
      precision.compute_dtype()):
      TensorFlow's graph rewrite, which computes the convolutions, matrix
      products and their gradients in it and keeps the variables, their
      updates and the BatchNorm statistics in float32 (a worker's grappler
      rewrites the graph it runs, ps side included, so only the workers
      need it). None: float32.
  """
  config = tf1.ConfigProto(allow_soft_placement=True,
                           log_device_placement=log_device_placement)
  rewrite = config.graph_options.rewrite_options
  if compute_dtype == 'bfloat16':
    rewrite.auto_mixed_precision_onednn_bfloat16 = rewrite.ON
  elif compute_dtype == 'float16' and num_gpus:
    rewrite.auto_mixed_precision = rewrite.ON
  elif compute_dtype == 'float16':
    rewrite.auto_mixed_precision_cpu = rewrite.ON
    # The GPU's rewrite on CPU ops, in float16 for real: by default this
    # mode emulates float16 with casts around float32 kernels, and that
    # aborted the worker on SyncReplicasOptimizer's graph (std::out_of_range
    # in the rewrite's last pass; TensorFlow 2.21). Read by the rewrite in
    # this process when it runs; with --existing_servers it runs in the
    # server's, which needs the variable set.
    os.environ.setdefault('TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_EMULATE_FP16',
                          '0')
  clustered = job_name == 'ps' or worker_hosts is not None
  if job_name == 'worker' and clustered:
    config.intra_op_parallelism_threads = threads or intra_op_threads(
        worker_hosts, task_index)
  if job_name == 'worker' and num_gpus > 0:
    config.gpu_options.allow_growth = True
    config.gpu_options.visible_device_list = str(task_index % num_gpus)
  else:
    config.device_count['GPU'] = 0
  if clustered:
    config.device_filters.extend(
        ['/job:ps'] if job_name == 'worker' else [])
    config.device_filters.append('/job:%s/task:%d' % (job_name, task_index))
  return config


def check_devices(num_gpus):
  """Raises UsageError if a worker asks for more GPUs than it sees."""
  visible = len(tf.config.list_physical_devices('GPU')) if num_gpus else 0
  if num_gpus > visible:
    raise UsageError('--num_gpus=%d but %d GPU(s) are visible: lower '
                     '--num_gpus or check CUDA_VISIBLE_DEVICES' % (num_gpus,
                                                                   visible))


def session_target(task, cluster, config, existing_servers):
  """Returns a worker's session target: its server, or none (one process).

  With existing_servers, the server at its address in worker_hosts;
  otherwise one started here, with config.
  """
  if cluster is None:
    return ''
  if existing_servers:
    master = 'grpc://' + task.worker_hosts[task.task_index]
    print('Using existing server at: %s' % master)
    return master
  return start_server(cluster, 'worker', task.task_index, config).target


def start_server(cluster, job_name, task_index, config):
  """Starts this task's gRPC server, or says in one line why it cannot."""
  try:
    return tf1.train.Server(cluster, job_name=job_name, task_index=task_index,
                            config=config)
  except (tf.errors.OpError, ValueError) as e:
    raise UsageError('could not start the %s %d server on %s (is the port '
                     'taken?): %s' % (job_name, task_index,
                                      cluster.task_address(job_name,
                                                           task_index),
                                      str(e).splitlines()[0]))


def done_queue(ps_index):
  """The queue on a ps task where each worker posts its index when done."""
  with tf.device('/job:ps/task:%d/cpu:0' % ps_index):
    return tf1.FIFOQueue(-1, tf.int32, shapes=[],
                         shared_name='done_queue_%d' % ps_index,
                         name='done_queue_%d' % ps_index)


def join_queues(num_workers):
  """A one-slot queue per worker on ps 0, filled once the worker joined.

  On ps 0, not on the chief: a restarted chief still sees who is there.
  """
  with tf.device('/job:ps/task:0/cpu:0'):
    return [tf1.FIFOQueue(1, tf.int32, shapes=[], shared_name='joined_%d' % i,
                          name='joined_%d' % i) for i in range(num_workers)]


def workers_named(indices, worker_hosts):
  """'worker 1 at host:port, worker 2 at host:port'."""
  return ', '.join('worker %d at %s' % (i, worker_hosts[i])
                   for i in sorted(indices))


def run_ps(cluster, task_index, lost_secs=10):
  """Serves variables until every worker is done or gone; returns the exit
  status.

  Once a worker said it is done (training is over), a worker that has not
  and whose port refuses connections for lost_secs (lost for good, stopped,
  or a listed slot never started) is not waited for.
  """
  config = session_config('ps', task_index)
  server = start_server(cluster, 'ps', task_index, config)
  workers = cluster.job_tasks('worker')
  print('ps %d: serving on %s; waiting for %d worker(s) to finish' %
        (task_index, cluster.task_address('ps', task_index), len(workers)),
        flush=True)
  with tf.Graph().as_default():
    # This ps's queue alone: its device filter hides the other ps tasks.
    dequeue = done_queue(task_index).dequeue()
    with tf1.Session(server.target, config=config) as sess:
      done, refusing = set(), {}  # refusing: {index: (why, since when)}
      next_report = time.time() + WAIT_REPORT_SECS
      while len(done) < len(workers):
        try:
          done.add(int(sess.run(dequeue, options=tf1.RunOptions(
              timeout_in_ms=1000))))
          continue
        except tf.errors.DeadlineExceededError:
          if not done:
            continue
        # Training is over: who else is still there?
        refusing = refusing_since(workers, done, refusing)
        late = set(range(len(workers))) - done
        gone = {i for i in late if i in refusing and
                time.time() - refusing[i][1] >= lost_secs}
        if gone == late:
          break
        if time.time() >= next_report:
          print('ps %d: %d of %d worker(s) finished; still waiting for %s '
                'to finish (Ctrl-C stops this ps; the chief\'s checkpoints '
                'hold the model)' % (task_index, len(done), len(workers),
                                     workers_named(late - gone, workers)),
                flush=True)
          next_report = time.time() + WAIT_REPEAT_SECS
  late = set(range(len(workers))) - done
  if late:
    print('ps %d: %d of %d worker(s) finished; not waiting for %s, gone; '
          'exiting' % (task_index, len(done), len(workers), ', '.join(
              'worker %d at %s (%s for %d s)' % (i, workers[i], refusing[i][0],
                                                  lost_secs)
              for i in sorted(late))), flush=True)
  else:
    print('ps %d: all %d worker(s) finished; exiting' % (task_index,
                                                        len(workers)),
          flush=True)
  # The last worker may still be posting to the other ps tasks.
  wait_for_exit([w for i, w in enumerate(workers) if i not in late],
                DONE_TIMEOUT_SECS * (cluster.num_tasks('ps') - 1) +
                WORKERS_EXIT_SECS)
  return 0


def refusing_since(workers, done, refusing):
  """{index: (why, since when)} of the workers not done whose port refuses
  connections now, each since it first did (refusing: the last answer)."""
  now = time.time()
  return {i: (why, refusing.get(i, (why, now))[1])
          for i, _, why in unreachable(workers, timeout=1.0) if i not in done}


# How long a ps that has every done post waits for the workers to exit,
# beyond the time they may take to post to the other ps tasks.
WORKERS_EXIT_SECS = 3


def wait_for_exit(workers, secs):
  """Waits, at most secs, until no worker takes a connection.

  A worker's session cleans up on the ps tasks after its done posts, in the
  background; a ps that went first would fail that clean-up, loudly, in
  the worker's log. A worker exits right after its posts, and its port
  then refuses connections.
  """
  deadline = time.time() + secs
  while (len(unreachable(workers, timeout=0.2)) < len(workers) and
         time.time() < deadline):
    time.sleep(0.05)


# How long a worker at the end waits for each ps to take its done post.
DONE_TIMEOUT_SECS = 10


def tell_cluster_done(master, config, task_index, ps_hosts, global_step,
                      close_tokens):
  """Releases the other workers, tells each ps, reads the global step.

  The chief of a synchronous run closes the token queue, so that workers
  blocked waiting for a token stop instead of hanging. Every worker then
  posts to each ps's done queue; a ps exits when all workers have posted.
  One ps at a time, each in a session and a graph of its own (a session
  waits, with no timeout, for every task its device filters name, and
  places every op of its graph) bounded by DONE_TIMEOUT_SECS: a ps that is
  lost or does not answer is named, and the others still hear.

  Args:
    master, config: This worker's session target and config.
    task_index: This worker's index, which it posts.
    ps_hosts: The ps tasks.
    global_step: The training graph's global step (a resource variable,
      read here through its name on its ps).
    close_tokens: Whether to close SyncReplicasOptimizer's token queue (the
      synchronous chief), which lives beside the global step.

  Returns:
    The global step, or None when its ps could not be reached. (A session
    left waiting on a ps that does not answer is a daemon thread's: it
    does not keep the process from exiting.)
  """
  step_ps = tf.DeviceSpec.from_string(global_step.device).task or 0
  step = None
  for i, host in enumerate(ps_hosts):
    lost = unreachable([host])
    if lost:
      why = 'it cannot be reached (%s)' % lost[0][2]
    else:
      ops, read = [], None
      with tf.Graph().as_default():  # The shared queue and step, by name.
        if i == step_ps:
          with tf.device(global_step.device):
            if close_tokens:
              ops.append(tf1.FIFOQueue(
                  -1, global_step.dtype.base_dtype, shapes=(),
                  shared_name='sync_token_q').close(
                      cancel_pending_enqueues=True))
            read = tf1.get_variable(
                global_step.op.name, [], global_step.dtype.base_dtype,
                trainable=False, use_resource=True).read_value().op
            ops.append(read)
        ops.append(done_queue(i).enqueue(task_index))
      why, results = run_bounded(master, config, task_index, i, ops)
      if read in results:
        step = int(results[read])
      if close_tokens and ops[0] not in results:
        print('Warning: could not release the workers waiting for a token '
              'on ps %d: %s' % (i, why), file=sys.stderr, flush=True)
      if ops[-1] in results:
        continue
    print('Warning: could not tell ps %d at %s that worker %d is done: %s; '
          'it waits for that until it is stopped (Ctrl-C; the chief\'s '
          'checkpoints hold the model)' % (i, host, task_index, why),
          file=sys.stderr, flush=True)
  return step


def run_bounded(master, config, task_index, ps_index, ops):
  """Runs each of ops, in order, in a session of worker task_index that
  sees only ps ps_index, for at most DONE_TIMEOUT_SECS in all.

  Returns:
    (why the first that failed did, or None; {op: its result} of those
    that ran).
  """
  filtered = tf1.ConfigProto()
  filtered.CopyFrom(config)
  del filtered.device_filters[:]
  filtered.device_filters.extend(['/job:ps/task:%d' % ps_index,
                                  '/job:worker/task:%d' % task_index])
  results, errors = {}, []

  def run():
    try:
      with tf1.Session(master, graph=ops[0].graph, config=filtered) as sess:
        for op in ops:
          try:
            results[op] = sess.run(op.outputs[0] if op.outputs else op)
          except tf.errors.OpError as e:
            errors.append(checkpoints.first_line(e))
    except Exception as e:  # pylint: disable=broad-except
      errors.append('%s: %s' % (type(e).__name__, checkpoints.first_line(e)))

  thread = threading.Thread(target=run, daemon=True, name='done_%d' % ps_index)
  thread.start()
  thread.join(DONE_TIMEOUT_SECS)
  if thread.is_alive():
    return 'it did not answer in %d s' % DONE_TIMEOUT_SECS, dict(results)
  return (errors[0] if errors else None), results


# What a step or a save fails with when a task of the cluster is lost.
LOST_TASK_ERRORS = (tf.errors.UnavailableError, tf.errors.AbortedError,
                    tf.errors.CancelledError)


def name_ps(missing):
  """'ps 1 at host:port (Connection refused), ...' for unreachable()'s
  list of ps tasks."""
  return ', '.join('ps %d at %s (%s)' % m for m in missing)


def lost_ps(ps_hosts):
  """name_ps() of the ps tasks that take no connection; None if none."""
  return name_ps(unreachable(ps_hosts)) or None


def unreachable(hosts, timeout=2.0):
  """Returns [(index, host:port, why)] of the hosts that take no connection.

  A plain TCP connect: what a task not started, a wrong port or a wrong
  host fails first; TensorFlow itself only waits, and says so in INFO.
  """
  missing = []
  for i, address in enumerate(hosts):
    host, _, port = address.rpartition(':')
    try:
      socket.create_connection((host.strip('[]'), int(port)), timeout).close()
    except OSError as e:
      missing.append((i, address, e.strerror or str(e)))
  return missing


class WaitReporter:
  """While a block runs, prints what it waits for: after WAIT_REPORT_SECS,
  then every WAIT_REPEAT_SECS.

  Use as `with WaitReporter(describe):`, where describe() returns the line
  to print now, or None when there is nothing to say.
  """

  def __init__(self, describe):
    self._describe = describe
    self._done = threading.Event()

  def __enter__(self):
    threading.Thread(target=self._run, daemon=True, name='wait_report').start()
    return self

  def __exit__(self, *unused_exc_info):
    self._done.set()

  def _run(self):
    delay = WAIT_REPORT_SECS
    while not self._done.wait(delay):
      line = self._describe()
      if line and not self._done.is_set():
        print(line, flush=True)
      delay = WAIT_REPEAT_SECS
