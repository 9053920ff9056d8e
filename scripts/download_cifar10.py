#!/usr/bin/env python3
"""Downloads the binary CIFAR-10 and unpacks it as --data_dir.

Fetches cifar-10-binary.tar.gz, checks its MD5, unpacks the
cifar-10-batches-bin folder and checks every file with the trainer's own
validation before moving it to --data_dir in one rename. Does nothing when
--data_dir already holds valid data, or when another process running at
the same time (another pod on a shared volume) put it there first. A failed
or corrupt download is reported in one line and leaves no partial files
behind. --url and --md5 point it at a mirror.

  python3 scripts/download_cifar10.py --data_dir=./cifar-10-batches-bin
"""

import argparse
import hashlib
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import cifar10_input  # pylint: disable=g-import-not-at-top,wrong-import-position

URL = 'https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz'
MD5 = 'c32a1d4ab5d03f1284b67883e8d87530'
ARCHIVE_DIR = 'cifar-10-batches-bin'
CHUNK = 1 << 20


class DownloadError(Exception):
  """The data could not be fetched or is not what was expected."""


def is_valid(data_dir):
  """True when data_dir holds readable training and test files."""
  try:
    cifar10_input.check_data(data_dir, eval_data=False)
    cifar10_input.check_data(data_dir, eval_data=True)
    return True
  except cifar10_input.DataError:
    return False


def fetch(url, path, timeout):
  """Downloads url to path with a progress line; returns its MD5."""
  md5 = hashlib.md5()
  try:
    with urllib.request.urlopen(url, timeout=timeout) as response, \
        open(path, 'wb') as out:
      total = int(response.headers.get('Content-Length') or 0)
      done, shown = 0, -1
      while True:
        chunk = response.read(CHUNK)
        if not chunk:
          break
        out.write(chunk)
        md5.update(chunk)
        done += len(chunk)
        percent = 100 * done // total if total else -1
        if percent != shown and (percent % 10 == 0 or not total):
          shown = percent
          print('  %s %.1f MB%s' % (os.path.basename(url), done / 1e6,
                                    ' (%d%%)' % percent if total else ''),
                flush=True)
  except (urllib.error.URLError, OSError, ValueError) as e:
    raise DownloadError('could not download %s: %s' % (
        url, getattr(e, 'reason', None) or e))
  return md5.hexdigest()


def download(data_dir, url=URL, md5=MD5, timeout=60):
  """Makes data_dir hold CIFAR-10; returns False when it already did.

  Raises:
    DownloadError: with one line saying what went wrong; nothing is left
      behind.
  """
  if is_valid(data_dir):
    return False
  if os.path.exists(data_dir) and os.listdir(data_dir):
    raise DownloadError(
        '%s exists but does not hold valid CIFAR-10 data; move it away or '
        'choose another --data_dir' % data_dir)
  parent = os.path.dirname(os.path.abspath(data_dir))
  os.makedirs(parent, exist_ok=True)
  # Everything happens in a temporary folder next to data_dir, renamed into
  # place only when complete and valid.
  work = tempfile.mkdtemp(prefix='.cifar10-download-', dir=parent)
  try:
    archive = os.path.join(work, 'cifar-10-binary.tar.gz')
    print('Downloading %s' % url, flush=True)
    got = fetch(url, archive, timeout)
    if got != md5:
      raise DownloadError('%s has MD5 %s, expected %s: the download is '
                          'corrupt or not the CIFAR-10 binary version' %
                          (url, got, md5))
    try:
      with tarfile.open(archive) as tar:
        tar.extractall(work, filter='data')
    except (tarfile.TarError, OSError) as e:
      raise DownloadError('cannot unpack %s: %s' % (url, e))
    unpacked = os.path.join(work, ARCHIVE_DIR)
    try:
      cifar10_input.check_data(unpacked, eval_data=False)
      cifar10_input.check_data(unpacked, eval_data=True)
    except cifar10_input.DataError as e:
      raise DownloadError('the archive from %s is not valid CIFAR-10: %s' %
                          (url, e))
    try:
      if os.path.isdir(data_dir) and not os.listdir(data_dir):
        try:
          os.rmdir(data_dir)
        except FileNotFoundError:
          pass  # Another process removed it first; the rename decides.
      os.rename(unpacked, data_dir)
    except OSError as e:
      # Several processes may fetch into one shared volume at once (the
      # pods of a TFJob): when another one got there first, all is well.
      if is_valid(data_dir):
        return False
      raise DownloadError('cannot move the data to %s: %s' % (data_dir, e))
  finally:
    shutil.rmtree(work, ignore_errors=True)
  return True


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--data_dir', default='./cifar-10-batches-bin',
                      help='where the files go (default: %(default)s)')
  parser.add_argument('--url', default=URL, help='default: %(default)s')
  parser.add_argument('--md5', default=MD5, help='default: %(default)s')
  parser.add_argument('--timeout', type=float, default=60,
                      help='seconds without data before giving up '
                      '(default: %(default)s)')
  args = parser.parse_args(argv)
  try:
    if download(args.data_dir, args.url, args.md5, args.timeout):
      print('CIFAR-10 is in %s' % args.data_dir)
    else:
      print('%s already holds CIFAR-10; nothing to do' % args.data_dir)
  except DownloadError as e:
    print('Error: %s' % e, file=sys.stderr)
    return 1
  return 0


if __name__ == '__main__':
  sys.exit(main())
