"""A progress line for long jobs: the download, the image converter."""

import time


def size(n):
  """A byte count for people: 512 B, 12.3 kB, 170.5 MB, 1.23 GB."""
  if n < 1e3:
    return '%d B' % n
  for unit, scale in (('kB', 1e3), ('MB', 1e6)):
    if n < 1e3 * scale:
      return '%.1f %s' % (n / scale, unit)
  return '%.2f GB' % (n / 1e9)


def duration(seconds):
  """0:07, 2:45, 1:02:03."""
  minutes, secs = divmod(int(seconds + 0.5), 60)
  hours, minutes = divmod(minutes, 60)
  return ('%d:%02d:%02d' % (hours, minutes, secs) if hours else
          '%d:%02d' % (minutes, secs))


class Progress:
  """A long job's progress: one line redrawn with a carriage return on a
  terminal; elsewhere (a log file) a line at each 10% (each 10 s when the
  total is unknown). Then a final line.

  Args:
    out: The stream to write to.
    total: What the job counts to; None when it is not known (a server that
      sent no Content-Length).
    start: What was done before this run (a resumed download's bytes).
    tty: Whether out is a terminal; None: ask it.
    clock: Seconds, for the rate.
    unit: Formats a count, and a rate before '/s': size (bytes) or, for
      images, `lambda n: '%d images' % n`.
  """

  BAR = 24

  def __init__(self, out, total, start=0, tty=None, clock=time.monotonic,
               unit=None):
    self.out = out
    self.unit = unit or size
    self.total = total
    self.start = self.done = start
    self.tty = out.isatty() if tty is None else tty
    self.clock = clock
    self.t0 = self.last = clock()
    self.mark = self._mark(start)
    self.pending = 0  # Length of a line drawn without its newline.
    self.drawn = start  # The bytes that line shows.

  def _mark(self, done):
    return 10 * done // self.total if self.total else 0

  def rate(self, now):
    elapsed = now - self.t0
    return (self.done - self.start) / elapsed if elapsed > 0 else 0.0

  def line(self, now, bar=False):
    """`[####....]  45.2 MB / 170.5 MB  26%  11.3 MB/s  0:11 left`, or
    `45.2 MB  11.3 MB/s` without a total."""
    rate = self.rate(now)
    if not self.total:
      return '%s  %s/s' % (self.unit(self.done), self.unit(rate))
    fraction = min(1.0, self.done / self.total)
    left = ('%s left' % duration((self.total - self.done) / rate) if rate
            else '--:-- left')
    text = '%s / %s  %3d%%  %s/s  %s' % (
        self.unit(self.done), self.unit(self.total), 100 * fraction,
        self.unit(rate), left)
    if bar:
      filled = int(self.BAR * fraction)
      text = '[%s%s]  %s' % ('#' * filled, '.' * (self.BAR - filled), text)
    return text

  def update(self, done):
    self.done = done
    now = self.clock()
    if self.tty:
      if now - self.last >= 0.1:
        self.last = now
        self._draw(self.line(now, bar=True))
    elif self.total:
      mark = self._mark(done)
      if mark > self.mark and done < self.total:
        self.mark = mark
        self._print(self.line(now))
    elif now - self.last >= 10:
      self.last = now
      self._print(self.line(now))

  def finish(self):
    now = self.clock()
    self._print('%s in %s (%s/s)' % (self.unit(self.done),
                                     duration(now - self.t0),
                                     self.unit(self.rate(now))))

  def end_line(self):
    """Ends a line left open by a redraw, up to date, so that the next one
    (an error, an interruption) starts clean."""
    if self.pending:
      if self.done != self.drawn:
        self._draw(self.line(self.clock(), bar=True))
      self.out.write('\n')
      self.out.flush()
      self.pending = 0

  def _draw(self, text):
    text = '  ' + text
    self.out.write('\r' + text.ljust(self.pending))
    self.out.flush()
    self.pending = len(text)
    self.drawn = self.done

  def _print(self, text):
    if self.tty:
      self._draw(text)
      self.end_line()
    else:
      self.out.write('  %s\n' % text)
      self.out.flush()
