"""Each task's session config: the devices it sees, its threads, device
filters, and --mixed_precision's graph rewrite.

The reference's processes each grabbed every GPU and every core. Here a ps
sees no GPU, a worker only its own, and the tasks on one host share its
cores (no more than a container's CPU quota allows).
"""

import os

import tensorflow as tf

from training.cluster.cluster_config import UsageError

tf1 = tf.compat.v1


def usable_cores():
  """The cores this process may use: those it may run on, and no more than
  its cgroup's CPU quota (a container's limit), which TensorFlow ignores."""
  cores = len(os.sched_getaffinity(0))
  try:
    with open('/proc/self/cgroup') as f:
      groups = [line.rstrip('\n').split(':', 2) for line in f]
  except OSError:
    return cores
  for _, controllers, path in groups:
    if controllers in ('', 'cpu') or 'cpu' in controllers.split(','):
      v2 = controllers == ''
      root = '/sys/fs/cgroup' if v2 else '/sys/fs/cgroup/cpu'
      while True:  # The group and each one above it.
        cores = min(cores, _quota(os.path.join(root, path.lstrip('/')), v2))
        if path in ('', '/'):
          break
        path = os.path.dirname(path)
  return max(1, cores)


def _quota(group, v2):
  """The cores a cgroup's quota allows, rounded up (inf: none, or none
  readable)."""
  try:
    if v2:
      with open(os.path.join(group, 'cpu.max')) as f:
        quota, period = f.read().split()
    else:
      with open(os.path.join(group, 'cpu.cfs_quota_us')) as f:
        quota = f.read().strip()
      with open(os.path.join(group, 'cpu.cfs_period_us')) as f:
        period = f.read().strip()
    if quota in ('max', '-1'):
      return float('inf')
    return -(-int(quota) // int(period))
  except (OSError, ValueError):
    return float('inf')


def share_of_host(hosts, task):
  """The cores a task may use shared by the tasks on its host (hosts, each
  'name:port', by name): at least 1."""
  host = task.rpartition(':')[0]
  return max(1, usable_cores() // sum(
      1 for h in hosts if h.rpartition(':')[0] == host))


def intra_op_threads(worker_hosts, task_index):
  """Returns the intra-op threads for a worker: its share of the cores.

  Every TensorFlow process sizes its op thread pool to all the cores. Two
  workers on a 2-core machine then run 4 compute threads that preempt each
  other: measured, 1 ps + 2 workers reached 0.82x the images/s of one
  process with 2 threads each and 0.99x with 1 thread each.
  """
  return share_of_host(worker_hosts, worker_hosts[task_index])


def ps_threads(ps_hosts, worker_hosts, task_index):
  """Returns a ps's inter-op and intra-op threads: its share of the cores.

  A ps runs small ops for every worker's step (the queues, the sums of the
  gradients, the update of at most the model's bytes), where a hand-off
  between threads costs more than the op: a pool of all the host's cores
  beside the workers on it, or over a container's quota, spends the ps's
  CPU switching threads (docs/scaling.md, "ps 0's CPU a worker's step").
  A ps on a machine of its own keeps every core.
  """
  return share_of_host(ps_hosts + worker_hosts, ps_hosts[task_index])


def session_config(job_name, task_index, worker_hosts=None, num_gpus=0,
                   threads=0, log_device_placement=False,
                   compute_dtype=None, ps_hosts=None):
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
    ps_hosts: A ps's cluster, for its threads (ps_threads()); None: none.
    log_device_placement: --log_device_placement.
    compute_dtype: What --mixed_precision computes in (see
      precision.compute_dtype()): TensorFlow's graph rewrite, which
      computes the convolutions, matrix products and their gradients in it
      and keeps the variables, their updates and the BatchNorm statistics
      in float32 (a worker's grappler rewrites the graph it runs, ps side
      included, so only the workers need it). None: float32.
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
  if job_name == 'ps' and ps_hosts:
    config.inter_op_parallelism_threads = pools = ps_threads(
        ps_hosts, worker_hosts or [], task_index)
    config.intra_op_parallelism_threads = pools
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
