"""training/runtime/progress.py: the progress line as a worker prints it, and read
back by the one pattern the benchmark, the elastic run and the tests use."""

from datetime import datetime

from training.runtime import progress

VALUES = dict(time=datetime(2026, 4, 7, 10, 13, 2, 154664), step=1200,
              loss=1.23456, accuracy=0.515625, examples_per_sec=1234.56,
              sec_per_batch=0.10371, left='0:02:05')


def test_a_line_as_the_reference_printed_it_with_the_time_left():
  assert progress.format_line(**VALUES) == (
      '2026-04-07 10:13:02.154664: step 1200, loss = 1.23 ,Train accuracy = '
      '0.52 (1234.6 examples/sec; 0.104 sec/batch; 0:02:05 left)')


def test_the_pattern_reads_back_what_the_line_writes():
  text = 'Worker 0: something else\n%s\n%s\n' % (
      progress.format_line(**VALUES),
      progress.format_line(**dict(VALUES, step=1205, left='?')))
  match = progress.PATTERN.search(text)
  assert match.groupdict() == {
      'time': '2026-04-07 10:13:02.154664', 'step': '1200', 'loss': '1.23',
      'accuracy': '0.52', 'examples_per_sec': '1234.6',
      'sec_per_batch': '0.104', 'left': '0:02:05'}
  assert progress.parse(text) == [
      progress.Progress(time=VALUES['time'], step=1200, loss=1.23,
                        accuracy=0.52, examples_per_sec=1234.6,
                        sec_per_batch=0.104, left='0:02:05'),
      progress.Progress(time=VALUES['time'], step=1205, loss=1.23,
                        accuracy=0.52, examples_per_sec=1234.6,
                        sec_per_batch=0.104, left='?')]


def test_a_time_on_the_second_keeps_its_microseconds():
  # str() of a datetime drops .000000; the line never does.
  line = progress.format_line(**dict(VALUES, time=datetime(2026, 4, 7)))
  assert line.startswith('2026-04-07 00:00:00.000000: step 1200, ')
  assert progress.parse(line)[0].time == datetime(2026, 4, 7)
