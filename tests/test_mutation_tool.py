"""tools/mutation.py's own logic (the campaign itself is too long for CI)."""

import datetime as dt
import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location("mutation", Path(__file__).resolve().parent.parent / "tools" / "mutation.py")
mutation = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mutation)


def test_stop_at_is_the_next_such_time_of_day():
    utc = dt.timezone.utc
    evening, morning = dt.datetime(2026, 11, 24, 23, 25, 7, tzinfo=utc), dt.datetime(2026, 11, 25, 9, 0, tzinfo=utc)
    assert mutation.stop_time("00:20", evening) == dt.datetime(2026, 11, 25, 0, 20, tzinfo=utc)  # past midnight
    assert mutation.stop_time("23:59", evening) == dt.datetime(2026, 11, 24, 23, 59, tzinfo=utc)
    assert mutation.stop_time("09:30", morning) == dt.datetime(2026, 11, 25, 9, 30, tzinfo=utc)
    assert mutation.stop_time("09:00", morning) == dt.datetime(2026, 11, 26, 9, 0, tzinfo=utc)  # now: tomorrow
