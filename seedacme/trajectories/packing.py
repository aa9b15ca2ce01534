"""Replay items of many small fields stored as one float32 column.

Reverb's cost of sampling an item grows with its columns (a chunk each to send,
decompress and turn into a tensor), not with their size. SAC's transition items hold
five tiny fields; sampled 256 at a time, one per gradient step, their sampling cost
rivalled the step on 2 cores. Measured in one process (`bench/learner_share.py`'s
notes, docs/benchmarks.md "The learner's share"): 256 items of 5 columns 2.58 ms of CPU
per batch, of one packed column 1.07 ms (and 8 transitions per packed item cost the
same per item).

`PackedLayout` packs fields of numeric dtypes into `[steps, width]` float32 on the
acting side (numpy) and unpacks a batch `[B, steps, width]` back to the fields, their
shapes and dtypes, inside the learner's compiled step. Exact for float32 and for
integers of magnitude below 2**24 (step types, discrete actions); float64 fields are
rounded to float32 (observations of MuJoCo envs: the networks read float32 anyway).
"""

from typing import Dict, Tuple

import numpy as np
import tensorflow as tf

PACKED = 'packed'


class PackedLayout:
  """Field name -> per-step shape and dtype, laid side by side in one float32 row."""

  def __init__(self, fields: Dict[str, Tuple[Tuple[int, ...], np.dtype]]):
    if not fields:
      raise ValueError('PackedLayout needs at least one field')
    self.fields = {name: (tuple(shape), np.dtype(dtype)) for name, (shape, dtype)
                   in fields.items()}
    self._slices = {}
    offset = 0
    for name, (shape, dtype) in self.fields.items():
      if not (np.issubdtype(dtype, np.floating) or np.issubdtype(dtype, np.integer)):
        raise ValueError(f'PackedLayout: field {name!r} has dtype {dtype}, not a number')
      size = int(np.prod(shape, dtype=np.int64))
      self._slices[name] = (offset, offset + size)
      offset += size
    self.width = offset

  def signature(self, steps: int) -> Dict[str, tf.TensorSpec]:
    """The replay item's signature: one `[steps, width]` float32 column."""
    return {PACKED: tf.TensorSpec((steps, self.width), tf.float32)}

  def pack(self, item: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """`{field: [..., steps, *shape]}` -> `{PACKED: [..., steps, width]}` (numpy)."""
    missing = sorted(set(self.fields) - set(item))
    if missing:
      raise KeyError(f'PackedLayout.pack: item lacks fields {missing}')
    columns = []
    for name, (shape, _) in self.fields.items():
      x = np.asarray(item[name], np.float32)
      lead = x.shape[:x.ndim - len(shape)]
      if x.shape[len(lead):] != shape:
        raise ValueError(f'PackedLayout.pack: field {name!r} has shape {x.shape}, '
                         f'expected [..., steps, {", ".join(map(str, shape))}]')
      columns.append(x.reshape(lead + (-1,)))
    return {PACKED: np.concatenate(columns, axis=-1)}

  def unpack(self, packed: tf.Tensor) -> Dict[str, tf.Tensor]:
    """`[..., steps, width]` -> `{field: [..., steps, *shape]}` in the fields' dtypes."""
    lead = tf.shape(packed)[:-1]
    out = {}
    for name, (shape, dtype) in self.fields.items():
      start, stop = self._slices[name]
      column = packed[..., start:stop]
      if np.issubdtype(dtype, np.integer):
        column = tf.round(column)
      out[name] = tf.cast(tf.reshape(column, tf.concat([lead, shape], 0)),
                          tf.as_dtype(dtype))
    return out
