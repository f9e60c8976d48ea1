"""The commit protocol and its parts: how a checkpoint comes to exist, is read, and goes.

Uploads (``_upload``), the commit (``_commit``, where the protocol is written down), the
ways to save (``_save``) and what a save measures of itself (``_meter``), saves in call
order (``_background``), deletion (``_delete``), leases and claims (``_lease``), the
``_latest`` pointer and the writer record (``_pointer``), the catalog of committed
checkpoints (``_catalog``), restore chains, reads and downloads (``_chains``, ``_read``,
``_download``), directory partitions (``_directories``), the layout a checkpointer uses
(``_paths``), and the public :mod:`~cairn.protocol.retention` (policies and GC),
:mod:`~cairn.protocol.discover` (finding checkpoints) and :mod:`~cairn.protocol.copy`
(copying checkpoints to another store). Every part takes the checkpointer's
:class:`~cairn.protocol._context.Context` (a read of one artifact, ``_read``, only its
store); the façades (:mod:`cairn.checkpointer`, :mod:`cairn.sync`) put them together.
"""
