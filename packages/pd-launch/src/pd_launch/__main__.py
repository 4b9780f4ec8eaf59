"""``python -m pd_launch``."""

import sys

from pd_launch._cli import main

sys.exit(main())
