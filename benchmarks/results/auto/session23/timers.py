"""The timing wrapper parts.py and tinyplain.py share: ``timed(owner, attr, key, into)`` replaces ``owner.attr`` by a
wrapper adding each call's seconds to ``into[key]`` (a Counter the script clears per generate call)."""
import functools, time


def timed(owner, attr, key, into):
    f = getattr(owner, attr)

    @functools.wraps(f)
    def w(*a, **k):
        s = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            into[key] += time.perf_counter() - s
    setattr(owner, attr, w)
