"""``shard="auto"``: which latent axis to split across the ranks, or none, from the latent's size.

The rule rests on measurements of the Wan 2.1 decoder layout at base_dim 32 (num_res_blocks 2) on a
2-core AVX-512 CPU, 2 ranks over gloo, one torch thread per process, ``MALLOC_MMAP_THRESHOLD_`` = 1 MiB
(docs/distributed.md). Each figure is a sharded rank's CPU time and decode memory ÷ the single process's
(the CPU time is what the wall time is on idle cores; a shared machine stretches the 2-rank wall only):

====================  =====================  =====================
latent H × W (T = 3)  height: CPU / memory   width: CPU / memory
====================  =====================  =====================
4 × 4                 0.89-0.94 / 0.71-0.76  0.88-0.90 / 0.73-0.76
8 × 8                 0.60 / 0.65-0.66       0.74-0.75 / 0.66-0.68
16 × 16               0.56-0.57 / 0.67       0.70 / 0.65-0.68
4 × 52                0.50 / 0.62-0.64       0.44-0.45 / 0.58-0.59
30 × 52 (T = 5)       0.55 / 0.56-0.58       0.54 / 0.56-0.59
====================  =====================  =====================

Why:

- **A strip pays per spatial convolution** for its halo rows (computed, then cropped): ``2 / (s·r)`` more
  work for ``r`` latent rows per rank at upsampling scale ``s``. Most of the work is at the last scales
  (``s`` = 4, 8), so even 2-row strips cost little there (4 × 52 by height: 0.50).
- **Width strips cost more than height strips of the same size** (8 × 8 and 16 × 16: 0.70-0.75 against
  0.56-0.60): W is the innermost dimension, so a width strip's boundary columns, its extended input and its
  cropped output are strided copies of short runs, where a height strip's are whole contiguous rows. Width
  wins only when its strips are much taller (4 × 52: 26 columns a rank against 2 rows).
- **The fixed costs do not shrink with the frame**: some 36 collectives per latent frame (one halo
  exchange a spatial convolution call) and the chunk's gather. Under about 16 latent positions a rank
  (4 × 4 on 2 ranks) they are as large as the work saved (CPU 0.9×), and the 2-rank wall is above the
  single process's.
- **The CPU convolution kernel no longer depends on the axis**: a strip runs the kernel PyTorch picks for
  the whole frame (``_kernels``), so a height strip no longer falls back to vol2col + GEMM, which once made
  height strips slower and larger (1.5× the single process's memory) than the whole frame.
"""

from __future__ import annotations

from typing import Literal

#: fewest latent positions (H·W ÷ ranks) a rank's strip must have for sharding to pay (4 × 4 on 2: 0.9×)
MIN_POSITIONS_PER_RANK = 16
#: how many times more rows per rank width strips need to be chosen over height strips
WIDTH_ADVANTAGE = 2


def choose_axis(height: int, width: int, world_size: int) -> Literal["height", "width"] | None:
    """The axis to split a latent of ``height`` × ``width`` across ``world_size`` ranks; None: don't shard.

    Height, unless width strips would have at least :data:`WIDTH_ADVANTAGE` times the rows, or height
    strips would have fewer than one row a rank where width strips would not. None with fewer than two
    ranks, when the latent has fewer rows than ranks along both axes, and when a rank's share would be
    under :data:`MIN_POSITIONS_PER_RANK` latent positions (the collectives then cost what the split saves).
    """
    if world_size < 2 or height * width < MIN_POSITIONS_PER_RANK * world_size:
        return None
    if height < world_size and width < world_size:
        return None  # some ranks would decode copies of another's strip along either axis
    if width >= WIDTH_ADVANTAGE * height or height < world_size:
        return "width"
    return "height"
