"""One measured training run, the launching library of every harness (the
benchmark, the network benchmark, machines of their own, the elastic run):
our trainer or TF2's peer.

Owns starting the tasks (on localhost ports, or each on a host of its own
in a network_namespaces.Network), waiting for them, reading each worker's
steady state from its log, and each task's CPU in that window (from /proc,
and with perf where asked). It needs no TensorFlow in this process.
"""

import json
import os
import subprocess
import sys
import threading
import time

import cpu_profile
from training.cluster import ports
from training.runtime import progress

TOOLS = os.path.dirname(os.path.abspath(__file__))
TRAINER = os.path.join(os.path.dirname(TOOLS), 'train_distributed.py')
PEER = os.path.join(TOOLS, 'tf2_peer.py')
TORCH_PEER = os.path.join(TOOLS, 'torch_peer.py')
TICKS = os.sysconf('SC_CLK_TCK')


def run_training(*, name, data_dir, work, num_ps, num_workers, steps,
                 batch_size, flags, network=None, perf=False):
  """Runs our trainer as a cluster (one process for num_ps=0).

  Args:
    name: The run's name, for its logs in work.
    flags: The trainer's flags beyond the cluster and the run's length.
    network: A network_namespaces.Network: each task on a host of its own.
    perf: Also split the steady state's CPU by kind of work with perf.

  Returns:
    {'images_per_sec', 'first_step_secs', 'shutdown_secs',
    'cpu_ms_per_image'} and, with perf, 'perf_ms_per_image'.
  """
  common = ['--data_dir=' + data_dir,
            '--train_dir=' + os.path.join(work, name),
            '--max_steps=%d' % steps, '--batch_size=%d' % batch_size,
            '--log_frequency=1', '--save_checkpoint_steps=%d' % (steps * 10),
            '--save_summaries_steps=%d' % (steps * 10)] + flags
  tasks = training_tasks(num_ps=num_ps, num_workers=num_workers,
                         network=network)
  sampler = CpuSampler()
  recorder = cpu_profile.Recorder(os.path.join(work, name + '.perf'))
  launched = time.time()
  if perf:
    recorder.start()
  try:
    run_tasks(name=name, work=work, sampler=sampler, timeout=60 + steps * 10,
              tasks=[(task, prefix, task_flags + common)
                     for task, task_flags, prefix in tasks])
  finally:
    recorder.stop()
  gone = time.time()
  lines = [progress_times(log_path(work, name, task))
           for task, _, _ in tasks if task.startswith('worker')]
  rate, window = steady_state(lines, batch_size)
  lines = [t for t in lines if t]  # A sync worker may get no step at all.
  result = {'images_per_sec': rate,
            'first_step_secs': min(t[0] for t in lines) - launched,
            'shutdown_secs': gone - max(t[-1] for t in lines),
            'cpu_ms_per_image': cpu_ms_per_image(sampler, *window)}
  if perf:
    groups = {pid: 'ps' if task.startswith('ps') else 'workers'
              for task, pid in sampler.pids.items()}
    result['perf_ms_per_image'] = cpu_profile.profile(recorder, groups,
                                                      *window)
    os.remove(recorder.path)
  return result


def training_tasks(*, num_ps, num_workers, network=None):
  """[(task, its cluster flags, its command prefix)] of a training run.

  One process for num_ps=0; else each task on a free localhost port or,
  with a network, on a host of its own there, each worker pinned to cores
  of its own (pinned_worker).
  """
  if num_ps == 0:
    return [('worker0', ['--ps_hosts='], [])]
  names = (['ps%d' % i for i in range(num_ps)] +
           ['worker%d' % i for i in range(num_workers)])
  if network:
    addresses = [network.add_host(n, 10 + i) for i, n in enumerate(names)]
  else:
    addresses = ['localhost:%d' % p for p in ports.free_ports(len(names))]
  hosts = ['--ps_hosts=' + ','.join(addresses[:num_ps]),
           '--worker_hosts=' + ','.join(addresses[num_ps:])]
  tasks = []
  for task in names:
    job = task.rstrip('0123456789')
    index = task[len(job):]
    flags, prefix = hosts + ['--job_name=' + job, '--task_index=' + index], []
    if network:
      prefix = network.exec_prefix(task)
      if job == 'worker':
        cores, threads = pinned_worker(int(index), num_workers)
        prefix += ['taskset', '-c', cores]
        flags.append('--intra_op_threads=%d' % threads)
    tasks.append((task, flags, prefix))
  return tasks


def pinned_worker(index, num_workers):
  """(cores for taskset, intra-op threads) of a worker on a host of its own.

  Hosts in network namespaces share this machine's cores; left to the
  scheduler, a worker waiting on the network lends its core to the other,
  which then computes faster than it would on a machine of its own. Pinned,
  each worker has its share of the cores, as on separate machines.
  """
  cores = sorted(os.sched_getaffinity(0))
  each = max(1, len(cores) // num_workers)
  start = (index * each) % len(cores)
  mine = cores[start:start + each]
  return ','.join(str(c) for c in mine), len(mine)


def log_path(work, name, task):
  """Where a run's task writes its output."""
  return os.path.join(work, '%s-%s.log' % (name, task))


def launch(path, command, **popen_args):
  """Starts command with its output in the log at path."""
  with open(path, 'w') as log:
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                            **popen_args)


def run_tasks(*, name, work, tasks, timeout, sampler):
  """Starts the trainer once per (task, command prefix, flags), samples
  their CPU, and waits for all to exit 0.

  Raises:
    RuntimeError: with the end of the log of a task that failed or hung.
  """
  procs = {}
  try:
    for task, prefix, flags in tasks:
      procs[task] = launch(log_path(work, name, task),
                           prefix + [sys.executable, TRAINER] + flags)
    sampler.start({task: proc.pid for task, proc in procs.items()})
    for task, proc in procs.items():
      try:
        code = proc.wait(timeout=timeout)
      except subprocess.TimeoutExpired:
        code = 'still running after %d s' % timeout
      if code != 0:
        raise task_failed(work=work, name=name, task=task, code=code)
  finally:
    sampler.stop()
    stop(procs.values())


def task_failed(*, work, name, task, code):
  """The RuntimeError of a run's task that exited with code (or hung): the
  end of its log."""
  with open(log_path(work, name, task)) as f:
    tail = f.read()[-3000:]
  return RuntimeError('%s: %s exited with %s; the end of its log:\n%s' %
                      (name, task, code, tail))


def stop(procs):
  """Kills and reaps the processes still running."""
  for proc in procs:
    if proc.poll() is None:
      proc.kill()
      proc.wait()


def progress_lines(text):
  """[(time, global step)] of the progress lines in a worker's output."""
  return [(line.time.timestamp(), line.step) for line in progress.parse(text)]


def progress_times(path):
  """The times of the progress lines in a worker's log."""
  with open(path) as f:
    return [t for t, _ in progress_lines(f.read())]


def steady_state(lines, batch_size):
  """(images/s, (start, end, images)) of the second half of each worker's
  steps, from each worker's progress times.

  A late worker with fewer than two steps in its second half adds nothing.
  The window spans those halves; its images are the steps of every worker
  in it, over which the CPU is counted. (0, 0, 0) when there is none.
  """
  rate, halves = 0.0, []
  for times in lines:
    half = times[len(times) // 2:]
    if len(half) > 1:
      rate += (len(half) - 1) * batch_size / (half[-1] - half[0])
      halves.append(half)
  if not halves:
    return rate, (0.0, 0.0, 0)
  start, end = (min(h[0] for h in halves), max(h[-1] for h in halves))
  images = batch_size * sum(1 for times in lines for t in times
                            if start < t <= end)
  return rate, (start, end, images)


def run_peer(*, name, data_dir, work, steps, batch_size, flags):
  """TF2's ParameterServerStrategy on 1 ps + 2 workers (tf2_peer.py).

  Its coordinator trains half the steps as a warmup and measures the other
  half. Returns the measurements of run_training (the first step: the end
  of the warmup).
  """
  free = ports.free_ports(4)
  hosts = ['--ps_hosts=localhost:%d' % free[0],
           '--worker_hosts=localhost:%d,localhost:%d' % tuple(free[1:3]),
           '--chief_host=localhost:%d' % free[3]]
  servers = {}
  launched = time.time()
  try:
    for task in ('ps0', 'worker0', 'worker1'):
      servers[task] = launch(log_path(work, name, task), [
          sys.executable, PEER, '--job_name=' + task[:-1],
          '--task_index=' + task[-1]] + hosts)
    return measure_peer(
        name=name, task='coordinator', others=servers, steps=steps,
        launched=launched, command=[
            sys.executable, PEER, '--job_name=chief',
            '--data_dir=' + data_dir, '--batch_size=%d' % batch_size,
            '--warmup_steps=%d' % (steps // 2),
            '--steps=%d' % (steps - steps // 2)] + hosts + flags)
  finally:
    stop(servers.values())  # They serve until killed.


def run_torch_peer(*, name, data_dir, work, steps, batch_size, world_size):
  """PyTorch's peer (torch_peer.py): one process, or world_size DDP ranks
  over gloo on localhost, each its share of the cores.

  Each rank trains half the steps as a warmup and measures the other half.
  Returns the measurements of run_training (the first step: the end of the
  warmup).
  """
  common = [sys.executable, TORCH_PEER, '--data_dir=' + data_dir,
            '--batch_size=%d' % batch_size, '--warmup_steps=%d' % (steps // 2),
            '--steps=%d' % (steps - steps // 2),
            '--world_size=%d' % world_size,
            '--master_port=%d' % ports.free_ports(1)[0]]
  ranks = {}
  launched = time.time()
  try:
    for rank in range(1, world_size):
      ranks['worker%d' % rank] = launch(
          log_path(work, name, 'worker%d' % rank),
          common + ['--rank=%d' % rank])
    result = measure_peer(name=name, task='worker0', others=ranks,
                          steps=steps, launched=launched,
                          command=common + ['--rank=0'])
    for task, proc in ranks.items():
      if proc.wait(timeout=60) != 0:
        raise task_failed(work=work, name=name, task=task,
                          code=proc.returncode)
    return result
  finally:
    stop(ranks.values())


def measure_peer(*, name, task, command, others, steps, launched):
  """Runs a peer's measuring process (task) beside its others {task: a
  started process}, sampling the CPU of all; returns its measurements.

  Raises:
    RuntimeError: with the end of its output, if it fails.
  """
  sampler = CpuSampler()
  proc = subprocess.Popen(command, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  sampler.start(dict({t: p.pid for t, p in others.items()}, **{task: proc.pid}))
  try:
    out, _ = proc.communicate(timeout=60 + steps * 10)
  finally:
    sampler.stop()
    stop([proc])
  if proc.returncode != 0:
    raise RuntimeError('%s: its %s exited with %d; the end of its output:\n%s'
                       % (name, task, proc.returncode, out[-3000:]))
  return peer_result(out, sampler, launched=launched, ended=time.time())


def peer_result(out, sampler, *, launched, ended):
  """run_peer's measurements from its coordinator's JSON line."""
  measured = json.loads([l for l in out.splitlines() if l.startswith('{')][-1])
  start, end = measured['warmup_done_at'], measured['ended_at']
  return {'images_per_sec': measured['images_per_sec'],
          'first_step_secs': start - launched,
          'shutdown_secs': ended - end,
          'cpu_ms_per_image': cpu_ms_per_image(
              sampler, start, end, measured['images_per_sec'] * (end - start))}


def tree_cpu_secs(pid):
  """CPU seconds (user + system) of a live process and its live children.

  A prefix such as `ip netns exec` may run the task as a child. Only the
  main thread's children are read, where a prefix starts its command:
  reading every thread's would cost the benchmark CPU of its own.
  0 for what has gone.
  """
  total = 0.0
  try:
    with open('/proc/%d/stat' % pid) as f:
      fields = f.read().rsplit(')', 1)[1].split()
    total += (int(fields[11]) + int(fields[12])) / TICKS
    with open('/proc/%d/task/%d/children' % (pid, pid)) as f:
      total += sum(tree_cpu_secs(int(c)) for c in f.read().split())
  except (OSError, IndexError, ValueError):
    pass
  return total


class CpuSampler:
  """Samples each task's CPU seconds every 0.1 s, so that the CPU a task
  spent in a window of the run (the steady state) can be read afterwards.
  """

  def __init__(self):
    self.pids, self.samples = {}, {}
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)

  def start(self, pids):
    """Starts sampling {task: pid}."""
    self.pids = dict(pids)
    self.samples = {task: [] for task in self.pids}
    self._thread.start()

  def _run(self):
    while not self._stop.is_set():
      for task, pid in self.pids.items():
        secs = tree_cpu_secs(pid)
        if secs:
          self.samples[task].append((time.time(), secs))
      self._stop.wait(0.1)

  def stop(self):
    """Stops sampling; the samples stay."""
    self._stop.set()
    if self._thread.is_alive():
      self._thread.join()

  def secs(self, task, start, end):
    """The task's CPU seconds between two times (linear between samples)."""
    return (interpolate(self.samples[task], end) -
            interpolate(self.samples[task], start))


def interpolate(samples, at):
  """The CPU seconds a [(time, CPU seconds)] series reached at time at
  (0 for a task gone before its first sample)."""
  if not samples:
    return 0.0
  before = [s for s in samples if s[0] <= at] or samples[:1]
  after = [s for s in samples if s[0] >= at] or samples[-1:]
  (t0, c0), (t1, c1) = before[-1], after[0]
  return c0 if t1 == t0 else c0 + (c1 - c0) * (at - t0) / (t1 - t0)


def cpu_ms_per_image(sampler, start, end, images):
  """{task: its CPU ms per image trained between start and end}; {} when
  no image was."""
  if images <= 0:
    return {}
  return {task: 1e3 * sampler.secs(task, start, end) / images
          for task in sampler.samples}
