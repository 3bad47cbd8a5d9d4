"""``python -m pipeline_opt`` is the ``pipeline-opt`` command."""

import sys

from pipeline_opt.cli import main

sys.exit(main())
