"""Forward hooks that belong to one ``generate`` call.

One enabled target may serve several calls at once (threads sharing the model). A hook registered on the
target's modules fires for every forward of those modules, whichever call runs it; a call's hooks read and
write that call's state only, so each runs for the forwards of the thread that registered it (a ``generate``
call runs on one thread) and does nothing for the others.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable


def this_call(hook: Callable[..., Any]) -> Callable[..., Any]:
    """``hook`` run only for forwards on the calling thread (it returns None, changing nothing, elsewhere)."""
    owner = threading.get_ident()

    @functools.wraps(hook)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() != owner:
            return None
        return hook(*args, **kwargs)

    return guarded
