"""``python -m oncebus.spark._state STATE_PATH``: a ``deduplicate_stream`` state's report as JSON.

The report is ``oncebus.spark.state_report`` (``oncebus.spark.stream.state``); this module only runs it
(``python -m`` on a module of the package that ``oncebus.spark`` has already imported draws a warning).
"""

from __future__ import annotations

from oncebus.spark.stream.state import main

if __name__ == "__main__":
    raise SystemExit(main())
