"""``python -m kanri.images build|lock`` (what ``make images`` and ``make images-lock`` run)."""

import sys

from kanri.images.build import main

sys.exit(main())
