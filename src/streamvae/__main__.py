"""``python -m streamvae``: the same as the ``streamvae`` command (see :mod:`streamvae.cli`)."""

import sys

from streamvae.cli import main

sys.exit(main())
