"""The pods of the last requests, parsed once: kube-scheduler sends a pod to filter and then the same Pod object to
prioritize (and again when it retries the pod), so the extender parses each Pod text into a :class:`GpuRequest` once.

Keyed by the Pod's JSON text as it arrived (``wire.ParsedArgs.pod_text``): :func:`parse_pod` reads the Pod alone, so
the same text is the same request, whatever changed elsewhere (a pod edited since has another text, and is parsed
again). A pod that does not parse is not kept (its error is raised again on each request). Bounded LRU; used from
the event loop only (the verbs run there one at a time)."""

from __future__ import annotations

from collections import OrderedDict

from ..model import GpuRequest, parse_pod
from .wire import ParsedArgs


class PodRequests:
    """The requests of the last ``size`` Pod texts parsed (see the module's docstring)."""

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._d: OrderedDict[bytes, GpuRequest] = OrderedDict()
        self.parsed = 0
        """How many Pod texts were parsed (not found here), whether they parsed or not: tests read it."""

    def request(self, args: ParsedArgs) -> GpuRequest:
        """``parse_pod(args.pod)``, from here when the same Pod text came before. Raises ``RequestError``."""
        text = args.pod_text
        if text is not None and (hit := self._d.get(text)) is not None:
            self._d.move_to_end(text)
            return hit
        self.parsed += 1
        req = parse_pod(args.pod)
        if text is not None:
            self._d[text] = req
            while len(self._d) > self.size:
                self._d.popitem(last=False)
        return req
