"""The cluster at run time: session configs, gRPC servers, the ps task's
life, and how the workers tell the ps tasks they are done.

The reference's ps blocked in server.join() forever and every process
grabbed every GPU and core. Here a ps serves until each worker has posted to
its done queue, then exits 0; each task sees only the devices it should use.
"""

import os
import sys

import tensorflow as tf

from cluster_config import UsageError

tf1 = tf.compat.v1


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
                   threads=0, log_device_placement=False):
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
  """
  config = tf1.ConfigProto(allow_soft_placement=True,
                           log_device_placement=log_device_placement)
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


def run_ps(cluster, task_index):
  """Serves variables until every worker is done; returns the exit status."""
  config = session_config('ps', task_index)
  server = start_server(cluster, 'ps', task_index, config)
  num_workers = cluster.num_tasks('worker')
  print('ps %d: serving on %s; waiting for %d worker(s) to finish' %
        (task_index, cluster.task_address('ps', task_index), num_workers),
        flush=True)
  with tf.Graph().as_default():
    # This ps's queue alone: its device filter hides the other ps tasks.
    dequeue = done_queue(task_index).dequeue()
    with tf1.Session(server.target, config=config) as sess:
      done = set()
      while len(done) < num_workers:
        done.add(int(sess.run(dequeue)))
  print('ps %d: all %d worker(s) finished; exiting' % (task_index,
                                                      num_workers), flush=True)
  return 0


def done_ops(num_ps, task_index, sync_opt=None):
  """Returns (close_tokens, [post_done per ps]) for tell_cluster_done().

  Args:
    num_ps: The ps tasks, each with a done queue.
    task_index: This worker's index, which it posts.
    sync_opt: The chief's SyncReplicasOptimizer, whose token queue it
      closes; None on other workers and in asynchronous training.
  """
  posts = [done_queue(i).enqueue(task_index) for i in range(num_ps)]
  close_tokens = (sync_opt.get_chief_queue_runner().queue.close(
      cancel_pending_enqueues=True) if sync_opt else tf.no_op())
  return close_tokens, posts


def tell_cluster_done(master, config, close_tokens, posts, global_step):
  """Releases the other workers, tells each ps, returns the global step.

  The chief of a synchronous run closes the token queue, so that workers
  blocked waiting for a token stop instead of hanging. Every worker then
  posts to each ps's done queue, one at a time, so that a ps that cannot be
  reached does not keep the others from hearing; a ps exits when all
  workers have posted. Returns None when the global step cannot be read.
  """
  def run(op, what):
    try:
      return sess.run(op)
    except tf.errors.OpError as e:
      print('Warning: could not %s: %s' % (what, str(e).splitlines()[0]),
            file=sys.stderr, flush=True)
      return None

  with tf1.Session(master, config=config) as sess:
    run(close_tokens, 'release the workers waiting for a token')
    step = run(global_step, 'read the global step')
    for i, post in enumerate(posts):
      run(post, 'tell ps %d that this worker is done' % i)
  return None if step is None else int(step)
