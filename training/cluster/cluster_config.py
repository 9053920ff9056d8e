"""The cluster's description: host lists, TF_CONFIG, and their validation.

Turns what a user gives (the --ps_hosts/--worker_hosts/--job_name/
--task_index flags, or the TF_CONFIG that Kubeflow and other launchers
write) into the task this process is, or one UsageError line saying what is
wrong and how to fix it. Plain values in, plain values out: no absl flags,
no TensorFlow.
"""

import collections
import json

class UsageError(Exception):
  """A command-line mistake, reported in one line."""


def is_host_port(address):
  """Whether address is 'host:port' with a port of 1-65535."""
  host, _, port = address.rpartition(':')
  return bool(host) and port.isdigit() and 0 < int(port) < 65536


def parse_hosts(value, flag_name):
  """Returns the host:port list of a comma-separated flag value.

  Args:
    value: Flag value, e.g. 'localhost:2222, localhost:2223'.
    flag_name: Name used in error messages.

  Raises:
    UsageError: for an empty entry, a missing host or a bad port.
  """
  if not value.strip():
    return []
  hosts = [h.strip() for h in value.split(',')]
  for host in hosts:
    if not is_host_port(host):
      raise UsageError('--%s=%s: %r is not hostname:port (port 1-65535); '
                       'write e.g. --%s=localhost:2222,localhost:2223' %
                       (flag_name, value, host, flag_name))
  if len(set(hosts)) != len(hosts):
    raise UsageError('--%s=%s lists a host:port twice' % (flag_name, value))
  return hosts


# TF_CONFIG's jobs (as Kubeflow's TFJob writes them) and what each becomes
# here: a chief (or its older name, master) is worker 0 and shifts the
# worker indices by one; an evaluator needs no address.
TF_CONFIG_JOBS = ('chief', 'master', 'worker', 'ps', 'evaluator')
CLUSTER_FLAGS = ('ps_hosts', 'worker_hosts', 'job_name', 'task_index')


def tf_config_flags(text):
  """Returns the cluster flags a TF_CONFIG value describes.

  Args:
    text: The TF_CONFIG value: JSON with "cluster" ({job: [host:port]}) and
      "task" ({"type": job, "index": i}).

  Returns:
    {'ps_hosts': str, 'worker_hosts': str, 'job_name': str,
     'task_index': int}, as they would be given on the command line.

  Raises:
    UsageError: naming what in TF_CONFIG is wrong.
  """
  cluster, task = read_tf_config(text)
  task_type, index = task.get('type'), task.get('index', 0)
  if task_type not in TF_CONFIG_JOBS:
    raise bad_tf_config('"task": "type" must be one of %s (got %s)' % (
        ', '.join(TF_CONFIG_JOBS), json.dumps(task_type)))
  if not isinstance(index, int) or isinstance(index, bool) or index < 0:
    raise bad_tf_config('"task": "index" must be an integer, 0 or more (got '
                        '%s)' % json.dumps(index))
  chief = cluster.get('chief', []) + cluster.get('master', [])
  ps = cluster.get('ps', [])
  if task_type != 'evaluator':
    if not ps:
      raise bad_tf_config('has no "ps" job: this trainer needs parameter '
                          'servers')
    if not chief and not cluster.get('worker'):
      raise bad_tf_config('has no "chief" or "worker" job')
    listed = len(chief if task_type in ('chief', 'master') else
                 cluster.get(task_type, []))
    if index >= listed:
      raise bad_tf_config('"task": %s %d is not in "cluster", which lists %d'
                          % (task_type, index, listed))
  if task_type in ('chief', 'master'):
    job_name = 'worker'
  elif task_type == 'worker':
    job_name, index = 'worker', index + len(chief)
  else:
    job_name = task_type
  return {'ps_hosts': ','.join(ps),
          'worker_hosts': ','.join(chief + cluster.get('worker', [])),
          'job_name': job_name, 'task_index': index}


def bad_tf_config(problem):
  """Returns the UsageError for a TF_CONFIG problem, with an example."""
  return UsageError('TF_CONFIG %s; expected e.g. {"cluster": {"ps": '
                    '["host0:2222"], "worker": ["host1:2222"]}, "task": '
                    '{"type": "worker", "index": 0}}' % problem)


def read_tf_config(text):
  """Returns TF_CONFIG's (cluster, task), with the cluster's hosts checked."""
  try:
    config = json.loads(text)
  except ValueError as e:
    raise bad_tf_config('is not valid JSON (%s)' % e)
  if not isinstance(config, dict):
    raise bad_tf_config('is not a JSON object')
  cluster, task = config.get('cluster'), config.get('task')
  if not isinstance(cluster, dict) or not isinstance(task, dict):
    raise bad_tf_config('needs a "cluster" object and a "task" object')
  for job, hosts in cluster.items():
    if job not in TF_CONFIG_JOBS:
      raise bad_tf_config('has a job %r in "cluster": jobs are %s' % (
          job, ', '.join(TF_CONFIG_JOBS)))
    if not isinstance(hosts, list) or not all(
        isinstance(h, str) and is_host_port(h) for h in hosts):
      raise bad_tf_config('"cluster": {"%s": %s} is not a list of "host:port" '
                          '(port 1-65535)' % (job, json.dumps(hosts)))
  addresses = [h for hosts in cluster.values() for h in hosts]
  if len(set(addresses)) != len(addresses):
    raise bad_tf_config('"cluster" lists a host:port twice')
  chief = cluster.get('chief', []) + cluster.get('master', [])
  if len(chief) > 1:
    raise bad_tf_config('lists %d chief/master tasks: there is at most one' %
                        len(chief))
  return cluster, task


def tf_config_updates(text, given):
  """Returns the cluster flags TF_CONFIG sets, and what to tell the user.

  Flags given on the command line win, so a TF_CONFIG left in the
  environment cannot silently redirect a hand-started task, and one value
  can be overridden. With all four given, TF_CONFIG is not even read.

  Args:
    text: The TF_CONFIG value ('' when unset).
    given: {flag name: value} of the CLUSTER_FLAGS given on the command line.

  Returns:
    ({flag name: value} to set, [lines to print]).

  Raises:
    UsageError: for a malformed TF_CONFIG that is used.
  """
  if not text.strip():
    return {}, []
  if all(n in given for n in CLUSTER_FLAGS):
    return {}, ['TF_CONFIG is set but not used: --%s are all given' %
                ', --'.join(CLUSTER_FLAGS)]
  values = tf_config_flags(text)
  taken = {n: values[n] for n in CLUSTER_FLAGS if n not in given}
  lines = ['Cluster from TF_CONFIG: %s' % ' '.join(
      '--%s=%s' % (n, v) for n, v in taken.items())]
  if given:
    lines.append('Given on the command line, over TF_CONFIG: %s' % ' '.join(
        '--%s=%s' % (n, given[n]) for n in CLUSTER_FLAGS if n in given))
  return taken, lines


# What this process is: 'ps', 'worker' or 'evaluator', its index, and the
# host:port lists (no ps: one process, without a cluster).
Task = collections.namedtuple('Task', 'job_name task_index ps_hosts '
                              'worker_hosts')


def resolve_task(job_name, task_index, ps_hosts, worker_hosts,
                 replicas_to_aggregate=None, existing_servers=False):
  """Returns the Task the cluster flags describe.

  Args:
    job_name: --job_name: 'ps', 'worker', 'evaluator' or None.
    task_index: --task_index, or None.
    ps_hosts: --ps_hosts, comma-separated; empty for one process.
    worker_hosts: --worker_hosts, comma-separated.
    replicas_to_aggregate: --replicas_to_aggregate, or None.
    existing_servers: --existing_servers.

  Raises:
    UsageError: with what is wrong and how to fix it.
  """
  ps = parse_hosts(ps_hosts, 'ps_hosts')
  workers = parse_hosts(worker_hosts, 'worker_hosts')
  if job_name == 'evaluator':
    return Task(job_name, task_index or 0, ps, workers)
  if not ps:
    # One process, no cluster: the worker hosts are not used.
    job_name, task_index = job_name or 'worker', task_index or 0
    if job_name != 'worker' or task_index != 0:
      raise UsageError('with --ps_hosts= (no cluster) the only task is '
                       '--job_name=worker --task_index=0')
    workers = workers[:1] or ['localhost:0']
  if job_name not in ('ps', 'worker'):
    raise UsageError('--job_name must be ps, worker or evaluator (got %r)' %
                     job_name)
  num_tasks = len(ps if job_name == 'ps' else workers)
  if num_tasks == 0:
    raise UsageError('--worker_hosts is empty: list at least one host:port')
  if task_index is None or not 0 <= task_index < num_tasks:
    raise UsageError('--task_index must be 0..%d for the %d %s task(s) in '
                     '--%s_hosts (got %s)' % (num_tasks - 1, num_tasks,
                                              job_name, job_name, task_index))
  overlap = set(ps) & set(workers)
  if overlap:
    raise UsageError('%s is in both --ps_hosts and --worker_hosts' %
                     sorted(overlap)[0])
  if existing_servers and job_name == 'ps':
    raise UsageError('--existing_servers is for workers: a ps task always '
                     'runs its own server')
  if replicas_to_aggregate is not None and not (
      1 <= replicas_to_aggregate <= len(workers)):
    raise UsageError('--replicas_to_aggregate must be 1..%d, the number of '
                     'workers (got %d)' % (len(workers),
                                           replicas_to_aggregate))
  return Task(job_name, task_index, ps, workers)
