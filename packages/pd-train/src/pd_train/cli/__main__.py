"""``python -m pd_train.cli``: the ``pd-train`` command (what a SLURM task or a sweep runs)."""

import sys

from pd_train.cli import main

sys.exit(main())
