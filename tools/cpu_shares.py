"""CPU shares on one host: a cgroup per task, held to a quota of cores.

A machine of its own needs CPU of its own: each task gets a cgroup whose
CFS quota is its share (cgroup v2's `cpu.max`, v1's `cpu.cfs_quota_us`
where the machine mounts v1), and is placed in it before TensorFlow starts
(`prefix()`), so every thread it ever makes is held to the share. The
period is short (10 ms), so a task is throttled in small slices, as a small
machine is slow all the time rather than stopped now and then.

Each group's name begins with its owner's PID (`c10m<pid>-`), so that
`close()` removes the owner's and `sweep()` those of owners that died
without removing theirs (killed with SIGKILL). Needs root.
"""

import os
import signal
import time

PERIOD_US = 10000
NAME = 'c10m%d-'


def _cpu_mounts():
  """{'v1': path, 'v2': path} of the mounts that can hold a CPU quota."""
  found = {}
  with open('/proc/mounts') as f:
    for line in f:
      _, path, kind, options = line.split()[:4]
      if kind == 'cgroup' and 'cpu' in options.split(','):
        found.setdefault('v1', path)
      elif kind == 'cgroup2':
        try:
          with open(os.path.join(path, 'cgroup.controllers')) as c:
            if 'cpu' in c.read().split():
              found.setdefault('v2', path)
        except OSError:
          pass
  return found


def why_unavailable():
  """None where CPU shares can be made; else why not, in a few words."""
  if os.geteuid() != 0:
    return 'needs root to make cgroups'
  if not _cpu_mounts():
    return ('needs a cgroup mount with the cpu controller (v2 with cpu in '
            'cgroup.controllers, or v1 mounted with cpu)')
  return None


class CpuShares:
  """Cgroups of this process, each with a CPU quota."""

  def __init__(self):
    mounts = _cpu_mounts()
    self.version = 'v2' if 'v2' in mounts else 'v1'
    self.root = mounts[self.version]
    self.prefix = NAME % os.getpid()
    self.groups = {}

  def make(self, task, cores=None):
    """Makes the task's group, held to `cores` (0.25: a quarter of one;
    None: not held until set()).

    Returns:
      The group's folder.
    """
    path = os.path.join(self.root, self.prefix + task)
    if self.version == 'v2':
      _write(os.path.join(self.root, 'cgroup.subtree_control'), '+cpu')
    os.mkdir(path)
    self.groups[task] = path
    self.set(task, cores)
    return path

  def set(self, task, cores):
    """Holds the task's group to `cores` (None: to nothing)."""
    path = self.groups[task]
    quota = None if cores is None else max(1000, int(round(
        cores * PERIOD_US)))
    if self.version == 'v2':
      _write(os.path.join(path, 'cpu.max'), '%s %d' % (
          'max' if quota is None else quota, PERIOD_US))
    else:
      _write(os.path.join(path, 'cpu.cfs_period_us'), str(PERIOD_US))
      _write(os.path.join(path, 'cpu.cfs_quota_us'),
             str(-1 if quota is None else quota))

  def prefix_for(self, task):
    """A command prefix that runs a program in the task's group: the shell
    moves itself in, then execs the program (same PID), so TensorFlow and
    all its threads start there."""
    procs = os.path.join(self.groups[task], 'cgroup.procs')
    return ['sh', '-c', 'echo $$ > "$0" && exec "$@"', procs]

  def throttled(self, task):
    """(periods, periods throttled) of the task's group so far."""
    stat = {}
    with open(os.path.join(self.groups[task], 'cpu.stat')) as f:
      for line in f:
        key, value = line.split()[:2]
        stat[key] = int(value)
    return stat.get('nr_periods', 0), stat.get('nr_throttled', 0)

  def close(self):
    """Kills what still runs in the groups, then removes them."""
    remove(list(self.groups.values()))
    self.groups = {}


def _write(path, text):
  with open(path, 'w') as f:
    f.write(text)


def pids_in(path):
  """The PIDs in a group (none for one that is gone)."""
  try:
    with open(os.path.join(path, 'cgroup.procs')) as f:
      return [int(p) for p in f.read().split()]
  except OSError:
    return []


def remove(paths):
  """Removes the groups, killing (SIGKILL) what still runs in them first."""
  for path in paths:
    for _ in range(100):
      for pid in pids_in(path):
        try:
          os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
          pass
      try:
        os.rmdir(path)
        break
      except FileNotFoundError:
        break
      except OSError:  # Busy: its processes are still exiting.
        time.sleep(0.05)


def owned(pid=None):
  """The groups whose owner is pid (any owner's where None)."""
  mounts = _cpu_mounts()
  if not mounts:
    return []
  root = mounts['v2' if 'v2' in mounts else 'v1']
  start = NAME % pid if pid is not None else 'c10m'
  return [os.path.join(root, n) for n in sorted(os.listdir(root))
          if n.startswith(start) and os.path.isdir(os.path.join(root, n))]


def sweep():
  """Removes the groups of owners that are no longer running; returns
  them."""
  dead = [p for p in owned() if not alive(_owner(p))]
  remove(dead)
  return dead


def _owner(path):
  return int(os.path.basename(path)[len('c10m'):].split('-')[0])


def alive(pid):
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    pass
  return True
