"""Where a training run's CPU goes, by process and by kind of work.

The benchmark's --perf: while a run trains, `perf record -a` samples every
CPU HZ times a second (its cpu-clock event, which a virtual machine has
too); afterwards the samples taken in the run's steady state are split by
process (its ps tasks and workers; idle CPUs; anything else) and by the
kind of work of the function sampled (KINDS, the first that matches),
counted as CPU milliseconds per image trained. /proc's accounting
(benchmark.CpuSampler) says how much CPU each process took; this says what
it did with it: the network's compute, TensorFlow's runtime, gRPC, the
kernel, the thread pools' spinning.

Needs the perf command and the right to sample every CPU (root, or
kernel.perf_event_paranoid at -1 or 0): unavailable() says what is missing.
"""

import re
import shutil
import signal
import subprocess
import tempfile
import time

HZ = 499  # Not a divisor of the kernel's tick: no lockstep with it.
MS_PER_SAMPLE = 1e3 / HZ

# (kind, a regular expression found in the sampled function's name), in the
# order they are tried. Code that perf finds in no file is oneDNN's: its
# kernels are generated at run time (xbyak), and TensorFlow on a CPU
# generates no other.
ONEDNN = 'compute: oneDNN kernels'
KINDS = (
    ('thread pools spinning',
     r'GlobalSteal|PopBack|MaybeGetTask|WaitForWork|NonEmptyQueueIndex|'
     r'EigenEnvironment::Task::operator='),
    ('kernel: scheduling, syscalls',
     r'finish_task_switch|_raw_spin_(un)?lock|futex|schedule|__switch_to|'
     r'irqentry|syscall|entry_SYSCALL|pick_next|update_curr|(en|de)queue_'
     r'task|try_to_wake|exit_to_user_mode|rseq'),
    ('memory: copies, allocation',
     r'malloc|free|memmove|memcpy|memset|_int_|unlink_chunk|consolidate|'
     r'tls_get_addr|mmap|munmap|page|Allocat'),
    ('gRPC, sockets, protobuf',
     r'grpc|tcp|_copy_(from|to)_iter|sock|skb|\bip_|epoll|poll|Cord|'
     r'[Pp]roto|Serialize|Parse|RecvTensor|Rendezvous'),
    ('Python', r'^_?Py|PyEval|^py'),
    (ONEDNN, r'dnnl|brgemm|jit_'),
    ('compute: Eigen and other kernels',
     r'Eigen|functor|PhiloxRandom'),
)
REST = 'TensorFlow runtime, the rest'
ORDER = [kind for kind, _ in KINDS] + [REST]
# PID, time, address, function (C++ names hold spaces and parentheses),
# and the file it is in, in parentheses.
SAMPLE = re.compile(
    r'^\s*(\d+)\s+(\d+\.\d+):\s+[0-9a-f]+\s+(.*)\s+\(([^()]*)\)$')


def unavailable():
  """None if this machine can record every CPU; else why not, in words."""
  if not shutil.which('perf'):
    return 'no perf command (Debian: apt-get install linux-perf)'
  with tempfile.NamedTemporaryFile(suffix='.perf') as out:
    done = subprocess.run(
        ['perf', 'record', '-a', '-q', '-e', 'cpu-clock', '-o', out.name,
         '--', 'true'], capture_output=True, text=True, check=False)
  if done.returncode:
    # perf's first line may be a bare "Error:"; the reason follows it.
    said = [l.strip() for l in done.stderr.splitlines()
            if l.strip() not in ('', 'Error:')]
    return 'perf record -a refused: %s' % (
        said[0] if said else 'exit status %d' % done.returncode)
  return None


class Recorder:
  """`perf record -a` into a file, from start() to stop(); its samples'
  times are the monotonic clock's, and wall_offset turns them into
  time.time()'s, which the progress lines use."""

  def __init__(self, path):
    self.path = path
    self.proc = None
    self.wall_offset = None

  def start(self):
    self.wall_offset = time.time() - time.monotonic()
    self.proc = subprocess.Popen(
        ['perf', 'record', '-a', '-q', '-F', str(HZ), '-e', 'cpu-clock',
         '-k', 'CLOCK_MONOTONIC', '-o', self.path],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

  def stop(self):
    """Stops recording; perf writes its file as it ends."""
    if self.proc and self.proc.poll() is None:
      self.proc.send_signal(signal.SIGINT)
      try:
        self.proc.wait(120)
      except subprocess.TimeoutExpired:
        self.proc.kill()
        self.proc.wait()


def kind_of(symbol, dso):
  """The kind of work of a sampled function (KINDS), from its name and the
  file it is in."""
  if dso.startswith('/tmp/perf-') or dso.startswith('[JIT]'):
    return ONEDNN
  for kind, pattern in KINDS:
    if re.search(pattern, symbol):
      return kind
  return 'Python' if 'libpython' in dso else REST


def parse(lines):
  """(pid, monotonic seconds, kind) of each line of `perf script -F
  pid,time,ip,sym,dso`; lines of another shape are skipped."""
  for line in lines:
    m = SAMPLE.match(line)
    if m:
      yield int(m.group(1)), float(m.group(2)), kind_of(m.group(3),
                                                        m.group(4))


def script_lines(path):
  """The samples of a recording, as `perf script` prints them."""
  return subprocess.run(
      ['perf', 'script', '-i', path, '-F', 'pid,time,ip,sym,dso'],
      capture_output=True, text=True, check=True).stdout.splitlines()


def ms_per_image(samples, groups, start, end, images):
  """CPU ms per image by group of processes and kind of work.

  Args:
    samples: (pid, wall-clock seconds, kind) tuples.
    groups: {pid: its group, e.g. 'ps' or 'workers'}; the idle CPUs (PID 0)
      are 'idle', any other process 'other'.
    start, end: The steady state, wall-clock seconds.
    images: Images trained between start and end.

  Returns:
    {group: {kind: ms per image}}; {} when no image was trained.
  """
  if images <= 0:
    return {}
  table = {}
  for pid, at, kind in samples:
    if start < at <= end:
      group = groups.get(pid, 'idle' if pid == 0 else 'other')
      row = table.setdefault(group, {})
      row[kind] = row.get(kind, 0.0) + MS_PER_SAMPLE / images
  return table


def profile(recorder, groups, start, end, images):
  """ms_per_image() of a finished recording (wall-clock start and end)."""
  samples = ((pid, at + recorder.wall_offset, kind) for pid, at, kind in
             parse(script_lines(recorder.path)))
  return ms_per_image(samples, groups, start, end, images)
