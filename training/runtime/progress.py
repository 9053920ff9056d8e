"""A worker's progress line: written here, and read back here.

Every --log_frequency steps a worker prints one (train_distributed.py's
run_loop); the benchmark, the elastic run and the tests read its time and
global step back. One format and one pattern, side by side, so that the
line and its readers cannot drift apart (tests/test_progress.py checks that
what format_line writes, PATTERN reads).
"""

from datetime import datetime
import re
from typing import NamedTuple

# The reference's line, with the time left to --max_steps added.
LINE = ('%(time)s: step %(step)d, loss = %(loss).2f ,Train accuracy = '
        '%(accuracy).2f (%(examples_per_sec).1f examples/sec; '
        '%(sec_per_batch).3f sec/batch; %(left)s left)')
TIME_FORMAT = '%Y-%m-%d %H:%M:%S.%f'
PATTERN = re.compile(
    r'^(?P<time>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}): step (?P<step>\d+), '
    r'loss = (?P<loss>\d+\.\d\d) ,Train accuracy = (?P<accuracy>\d\.\d\d) '
    r'\((?P<examples_per_sec>\d+\.\d) examples/sec; '
    r'(?P<sec_per_batch>\d+\.\d{3}) sec/batch; '
    r'(?P<left>\d+:\d\d:\d\d|\?) left\)$', re.M)


class Progress(NamedTuple):
  """One progress line's values."""
  time: datetime
  step: int
  loss: float
  accuracy: float
  examples_per_sec: float
  sec_per_batch: float
  left: str  # H:MM:SS, or '?' before the global step has moved.


def format_line(*, time, step, loss, accuracy, examples_per_sec,
                sec_per_batch, left):
  """The line a worker prints; time is a datetime (always with its
  microseconds, which str() of a datetime drops when they are 0)."""
  return LINE % dict(time=time.strftime(TIME_FORMAT), step=step, loss=loss,
                     accuracy=accuracy, examples_per_sec=examples_per_sec,
                     sec_per_batch=sec_per_batch, left=left)


def parse(text):
  """[Progress] of every progress line in text (a log), in order."""
  return [Progress(time=datetime.strptime(m['time'], TIME_FORMAT),
                   step=int(m['step']), loss=float(m['loss']),
                   accuracy=float(m['accuracy']),
                   examples_per_sec=float(m['examples_per_sec']),
                   sec_per_batch=float(m['sec_per_batch']), left=m['left'])
          for m in PATTERN.finditer(text)]
