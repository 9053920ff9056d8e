"""The benchmark's input pipelines, measured in its own process.

Owns the records/s, and this process's CPU ms per record, of the trainer's
16-thread queue pipeline (and with half the photos erased), of tf.data with the same decoding and
preprocessing, and of a numpy decode of the same bytes from memory (no
augmentation: an upper bound). Run with TensorFlow in graph mode.
"""

import time

import numpy as np
import tensorflow as tf

import cifar10_input

tf1 = tf.compat.v1
QUEUE_INPUT = "queue, 16 threads (the trainer's)"
ERASING_INPUT = 'the same, --random_erasing=0.5'
TFDATA_INPUT = 'tf.data, same decoding'
NUMPY_INPUT = 'numpy decode from memory (bound)'


def measure(*, data_dir, batch_size, seconds):
  """({pipeline: records/s}, {pipeline: CPU ms per record}); the numpy
  bound's CPU is not counted."""
  queue, queue_ms = queue_records_per_sec(data_dir, batch_size, seconds)
  erasing, erasing_ms = queue_records_per_sec(data_dir, batch_size, seconds,
                                              erasing=0.5)
  tfdata, tfdata_ms = tfdata_records_per_sec(data_dir, batch_size, seconds)
  rates = {QUEUE_INPUT: queue, ERASING_INPUT: erasing, TFDATA_INPUT: tfdata,
           NUMPY_INPUT: numpy_records_per_sec(data_dir, seconds)}
  return rates, {QUEUE_INPUT: queue_ms, ERASING_INPUT: erasing_ms,
                 TFDATA_INPUT: tfdata_ms}


def queue_records_per_sec(data_dir, batch_size, seconds, erasing=0.0):
  """The trainer's queue pipeline, as configured by default (but for
  --random_erasing): timed_batches' (records/s, CPU ms per record)."""
  with tf.Graph().as_default():
    images, _ = cifar10_input.generate_batch_inputs(
        eval_data=False, shuffle=True, data_dir=data_dir,
        batch_size=batch_size, erasing=erasing)
    with tf1.train.MonitoredSession() as sess:
      return timed_batches(lambda: sess.run(images.op), batch_size, seconds)


def tfdata_records_per_sec(data_dir, batch_size, seconds):
  """FixedLengthRecordDataset with the same decoding and preprocessing:
  timed_batches' (records/s, CPU ms per record)."""
  files, _ = cifar10_input.check_data(data_dir, eval_data=False)

  def decode(values):
    records = tf1.decode_raw(values, tf.uint8)
    images = tf.transpose(tf.reshape(records[:, 1:], [-1, 3, 32, 32]),
                          [0, 2, 3, 1])
    return (cifar10_input.preprocess(images, True, True),
            tf.cast(records[:, 0], tf.int32))

  with tf.Graph().as_default():
    dataset = (tf.data.FixedLengthRecordDataset(files,
                                                cifar10_input.RECORD_BYTES)
               .repeat().batch(batch_size)
               .map(decode, num_parallel_calls=tf.data.AUTOTUNE)
               .prefetch(tf.data.AUTOTUNE))
    images, _ = tf1.data.make_one_shot_iterator(dataset).get_next()
    with tf1.Session() as sess:
      return timed_batches(lambda: sess.run(images.op), batch_size, seconds)


def numpy_records_per_sec(data_dir, seconds):
  """Decoding bytes already in memory to float32 HWC: the upper bound."""
  files, _ = cifar10_input.check_data(data_dir, eval_data=False)
  raw = b''.join(open(f, 'rb').read() for f in files)
  count, start = 0, time.time()
  while time.time() - start < seconds:
    records = np.frombuffer(raw, np.uint8).reshape(-1,
                                                   cifar10_input.RECORD_BYTES)
    images = records[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    images.astype(np.float32)
    records[:, 0].astype(np.int32)
    count += len(records)
  return count / (time.time() - start)


def timed_batches(run, batch_size, seconds):
  """(records/s, this process's CPU ms per record) of run(), a batch each,
  for seconds after a few batches to fill the queues and caches."""
  for _ in range(3):
    run()
  count, start, cpu = 0, time.time(), time.process_time()
  while time.time() - start < seconds:
    run()
    count += batch_size
  return (count / (time.time() - start),
          1e3 * (time.process_time() - cpu) / count)
