#!/usr/bin/env python3
"""Downloads the binary CIFAR-10 and unpacks it as --data_dir.

Fetches cifar-10-binary.tar.gz into DATA_DIR.tar.gz.part, next to
--data_dir, with a progress bar; checks its MD5, unpacks it next to
--data_dir, checks every file with the trainer's own validation
(data_layout, which needs no TensorFlow), moves it to --data_dir in one
rename, and only then deletes the .part file: --data_dir never holds a
partial download.

Interrupted (Ctrl-C, SIGTERM, a dropped connection, a full disk), it keeps
what it got in the .part file and says so in one line; the same command
resumes it with an HTTP Range request (or starts again where the server
does not resume). A corrupt download is deleted. Does nothing when
--data_dir already holds valid data, put there by this or another process
(another pod on a shared volume); processes sharing a .part file take turns
on a lock. A failure is one line `Error: ...` on stderr, exit status 1; an
interruption one line `Interrupted: ...`, exit status 130 (143 for
SIGTERM). --url and --md5 point it at a mirror; --url may also name the
tarball already on this machine (a path or a file:// URL), fetched
elsewhere: it is checked and unpacked, never copied or deleted.

  python3 scripts/download_cifar10.py --data_dir=./cifar-10-batches-bin
  python3 scripts/download_cifar10.py --url=~/Downloads/cifar-10-binary.tar.gz
"""

import argparse
import os
import re
import shutil
import signal
import sys
import tarfile
import tempfile
import threading
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# Not cifar10_input: it imports TensorFlow, whose start-up log lines would
# come before our one line.
from training.storage import data_layout  # pylint: disable=g-import-not-at-top,wrong-import-position
from training.storage import resumable_download  # pylint: disable=g-import-not-at-top,wrong-import-position
from training.storage.resumable_download import DownloadError  # pylint: disable=g-import-not-at-top,wrong-import-position

URL = 'https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz'
MD5 = 'c32a1d4ab5d03f1284b67883e8d87530'
ARCHIVE_DIR = 'cifar-10-batches-bin'
EXIT_ERROR = 1


class Interrupted(KeyboardInterrupt):
  """SIGTERM, handled as Ctrl-C is."""


def check(data_dir):
  """Raises data_layout.DataError unless data_dir holds readable training
  and test files."""
  data_layout.check_data(data_dir, eval_data=False)
  data_layout.check_data(data_dir, eval_data=True)


def is_valid(data_dir):
  """Whether check(data_dir) passes."""
  try:
    check(data_dir)
    return True
  except data_layout.DataError:
    return False


def extract(tar, work):
  """Extracts tar into work, refusing members that would land outside it
  (tarfile's 'data' filter where this Python has it, the same checks by
  hand before)."""
  if hasattr(tarfile, 'data_filter'):
    tar.extractall(work, filter='data')
    return
  for member in tar.getmembers():
    parts = member.name.split('/')
    if (member.name.startswith('/') or '..' in parts or
        not (member.isfile() or member.isdir())):
      raise tarfile.TarError('unsafe member %s' % member.name)
  tar.extractall(work)


def unpack(archive, data_dir, url, keep=False):
  """Unpacks and checks archive next to data_dir, renames it to data_dir;
  a bad archive is deleted unless keep (the user's own file).

  Returns False when another process put valid data there first.
  """
  parent = os.path.dirname(os.path.abspath(data_dir))
  try:
    work = tempfile.mkdtemp(prefix='.cifar10-download-', dir=parent)
  except OSError as e:
    raise DownloadError('cannot unpack into %s: %s: choose another '
                              '--data_dir' % (parent, e.strerror or e))
  try:
    try:
      with tarfile.open(archive, 'r:gz') as tar:
        extract(tar, work)
      unpacked = os.path.join(work, ARCHIVE_DIR)
      if not os.path.isdir(unpacked):
        raise data_layout.DataError('it has no %s folder' % ARCHIVE_DIR)
      check(unpacked)
    except OSError as e:
      if e.errno is None:  # tarfile's own errors about the bytes.
        raise bad_archive(archive, url, keep, 'a valid tar.gz (%s)' % e)
      raise DownloadError(
          'cannot unpack %s into %s: %s: free some space and run again (the '
          'checked download stays in %s)' % (archive, parent,
                                             e.strerror or e, archive))
    except (tarfile.TarError, EOFError, zlib.error) as e:
      raise bad_archive(archive, url, keep, 'a valid tar.gz (%s)' % e)
    except data_layout.DataError as e:
      raise bad_archive(archive, url, keep, 'valid CIFAR-10: %s' % e)
    return move_into_place(unpacked, data_dir)
  finally:
    shutil.rmtree(work, ignore_errors=True)


def bad_archive(archive, url, keep, what):
  """Deletes archive unless keep; the DownloadError that says it is not
  what."""
  if keep:
    return DownloadError('%s is not %s: check --url and --md5' % (
        archive, what))
  os.remove(archive)
  return DownloadError('the archive from %s is not %s; %s is deleted: '
                             'check --url and --md5' % (url, what, archive))


def move_into_place(unpacked, data_dir):
  """Renames unpacked to data_dir; False when another process was first."""
  try:
    if os.path.isdir(data_dir) and not os.listdir(data_dir):
      try:
        os.rmdir(data_dir)
      except FileNotFoundError:
        pass  # Another process removed it first; the rename decides.
    os.rename(unpacked, data_dir)
  except OSError as e:
    # The pods of a TFJob may fetch into one shared volume at once: when
    # another one got there first, all is well.
    if is_valid(data_dir):
      return False
    raise DownloadError('cannot move the data to %s: %s' %
                              (data_dir, e))
  return True


def download(data_dir, url=URL, md5=MD5, timeout=60, state=None, out=None):
  """Makes data_dir hold CIFAR-10; returns False when it already did.

  Raises:
    DownloadError: with one line saying what went wrong; --data_dir is
      left as it was, and a resumable download stays in its .part file.
    KeyboardInterrupt: likewise.
  """
  out = out or sys.stdout
  state = state or resumable_download.State(
      resumable_download.part_path(data_dir))
  if is_valid(data_dir):
    resumable_download.remove_stale(state.path)
    return False
  if os.path.exists(data_dir) and (not os.path.isdir(data_dir) or
                                   os.listdir(data_dir)):
    if is_valid(data_dir):  # Another process put it there just now.
      return False
    raise DownloadError(
        '%s exists but does not hold valid CIFAR-10 data; move it away or '
        'choose another --data_dir' % data_dir)
  path = resumable_download.local_path(url)
  if path is not None:
    return from_file(os.path.expanduser(path), data_dir, md5, out)
  try:
    os.makedirs(os.path.dirname(os.path.abspath(data_dir)), exist_ok=True)
    part = resumable_download.lock(state.path, out)
  except OSError as e:
    raise DownloadError('cannot write %s: %s: choose another '
                              '--data_dir' % (state.path, e.strerror or e))
  finished = False  # Then the .part file goes.
  try:
    if is_valid(data_dir):  # Another process finished while we waited.
      finished = True
      return False
    got = resumable_download.fetch(url, part, state, timeout, out)
    if got != md5.lower():
      finished = True
      raise DownloadError(
          '%s has MD5 %s, expected %s: the download is corrupt or not the '
          'CIFAR-10 binary version; %s is deleted%s: check --url and --md5' %
          (url, got, md5, state.path,
           ' (%s of it came from an earlier run)' %
           resumable_download.size(state.start) if state.start else ''))
    state.checked = True
    moved = unpack(state.path, data_dir, url)
    finished = True
    return moved
  finally:
    resumable_download.release(part, state.path, delete=finished)


def from_file(path, data_dir, md5, out):
  """Checks and unpacks a tarball already on this machine (--url=PATH):
  nothing downloaded, and the file is left as it is, whatever it holds."""
  try:
    with open(path, 'rb') as f:
      print('Checking %s (%s)' % (path, resumable_download.size(os.fstat(
          f.fileno()).st_size)), file=out, flush=True)
      got = resumable_download.hash_file(f).hexdigest()
  except OSError as e:
    raise DownloadError(
        'cannot read %s: %s: pass --url=PATH of a cifar-10-binary.tar.gz on '
        'this machine, or the URL to download it from' % (
            path, e.strerror or e))
  if got != md5.lower():
    raise DownloadError(
        '%s has MD5 %s, expected %s: it is damaged or not the CIFAR-10 binary '
        'version (cifar-10-binary.tar.gz): check --url and --md5' % (
            path, got, md5))
  parent = os.path.dirname(os.path.abspath(data_dir))
  try:
    os.makedirs(parent, exist_ok=True)
  except OSError as e:
    raise DownloadError('cannot make %s: %s: choose another --data_dir'
                              % (parent, e.strerror or e))
  return unpack(path, data_dir, path, keep=True)


def interrupted_line(state):
  """The one line for Ctrl-C: what is kept, and how to go on."""
  if state.checked:
    return ('Interrupted: the download is complete in %s; run the same '
            'command again to unpack it' % state.path)
  if not state.done or not os.path.exists(state.path):
    return 'Interrupted: nothing downloaded yet'
  return 'Interrupted: %s; %s' % (resumable_download.kept(state),
                                  resumable_download.RESUME)


def on_sigterm(signum, frame):
  """SIGTERM's handler: stops the download as Ctrl-C does."""
  del signum, frame
  raise Interrupted()


def main(argv=None):
  """Downloads as the command line asks; returns the exit status."""
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--data_dir', default='./cifar-10-batches-bin',
                      help='where the files go (default: %%(default)s); the '
                      'download is kept in DATA_DIR%s until checked' %
                      resumable_download.PART_SUFFIX)
  parser.add_argument('--url', default=URL, help='where to download it '
                      'from, or the path (or file:// URL) of the tarball '
                      'already on this machine (default: %(default)s)')
  parser.add_argument('--md5', default=MD5, help='default: %(default)s')
  parser.add_argument('--env_names', action='store_true',
                      help='name CIFAR10_URL and CIFAR10_MD5 where it would '
                      'name --url and --md5: what run_local_cluster.sh, '
                      'which passes this, reads')
  parser.add_argument('--timeout', type=float, default=60,
                      help='seconds without data before giving up '
                      '(default: %(default)s)')
  args = parser.parse_args(argv)
  state = resumable_download.State(resumable_download.part_path(args.data_dir))
  # Only the main thread may handle signals (not a test's other thread).
  main_thread = threading.current_thread() is threading.main_thread()
  previous = signal.signal(signal.SIGTERM, on_sigterm) if main_thread else None
  try:
    if download(args.data_dir, args.url, args.md5, args.timeout, state):
      print('CIFAR-10 is in %s' % args.data_dir)
    else:
      print('%s already holds CIFAR-10; nothing to do' % args.data_dir)
  except (DownloadError, OSError) as e:  # OSError: one not foreseen.
    line = re.sub(r'\s*\n\s*', '; ', str(e).strip())
    if args.env_names:
      line = re.sub(r'--(url|md5)\b', lambda m: 'CIFAR10_' +
                    m.group(1).upper(), line)
    print('Error: %s' % line, file=sys.stderr)
    return EXIT_ERROR
  except KeyboardInterrupt as e:
    print(interrupted_line(state), file=sys.stderr)
    return 128 + (signal.SIGTERM if isinstance(e, Interrupted) else
                  signal.SIGINT)
  finally:
    if previous is not None:
      signal.signal(signal.SIGTERM, previous)
  return 0


if __name__ == '__main__':
  sys.exit(main())
