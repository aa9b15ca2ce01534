"""bsuite Catch: a ball falls; move the paddle under it. Return +1 or -1 per episode."""

import dm_env
from bsuite.environments import catch as bsuite_catch


def make_catch(seed: int, rows: int = 10, columns: int = 5) -> dm_env.Environment:
  """Catch as a dm_env environment with float32 observations of shape (rows, columns)."""
  return bsuite_catch.Catch(rows=rows, columns=columns, seed=seed)
