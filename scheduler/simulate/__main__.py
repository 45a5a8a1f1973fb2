"""``python -m scheduler.simulate``: trace replay (see ``scheduler.simulate.replay``)."""

from scheduler.simulate.replay import main

raise SystemExit(main())
