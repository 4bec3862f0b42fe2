"""``python -m geoserve``: the same as the ``geoserve`` command."""

import sys

from geoserve.cli import main

sys.exit(main())
