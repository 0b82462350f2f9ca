"""The mount's renderings of a log: text and JSON-lines sizes, view indexes, LogView.

Kafka's core (engine.log, engine.segment, engine.cleaner) knows nothing of
this package.  It attaches to a log through one hook, ``Log.append_observer``
(:func:`engine.views.index.attach`), and keeps each segment's view indexes as the
segment's ``attachment`` (an ``engine.segment.SegmentAttachment``, of which the
segment knows nothing more), which the segment drops when bytes it holds change;
the indexes are then rebuilt by one scan, as after a remount.

Modules: ``render`` (the renderings and their sizes, byte for byte), ``index``
(ViewIndex, the segment's attachment and the append observer), ``log_view`` (LogView,
ViewIdentity, record_at), ``consume`` (a consumer group's view of a log).
"""

from engine.views.index import ViewIndex, attach, load_remote_view_indexes, view_index, view_index_and_damage
from engine.views.log_view import LogView, ViewFormat, ViewIdentity, record_at

__all__ = ["LogView", "ViewFormat", "ViewIdentity", "ViewIndex", "attach", "load_remote_view_indexes", "record_at",
           "view_index",
           "view_index_and_damage"]
