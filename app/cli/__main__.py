"""``python -m app.cli``: the ``normcal`` command."""

from __future__ import annotations

import sys

from app.cli.main import main

sys.exit(main())
